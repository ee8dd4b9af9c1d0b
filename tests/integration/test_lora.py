"""Multi-LoRA through the gateway on the real Triton stack (the CPU engine applies the adapters).

The founding guide's example: concurrent requests over the base model and two adapters, each answer
equal to transformers + PEFT with the same adapter, streamed and not, on the engine route, the
ensemble route, and an ensemble that passes no LoRA inputs on (TensorRT-LLM before v0.15). Then
evictions, the official SDKs as a new user tries them, dynamic loading and hostile inputs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.integration.conftest import LORA_CACHE_ADAPTERS, TritonStack
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess
from tests.support.lora import convert_like_hf_lora_convert, make_peft_adapter, reference_greedy
from tests.support.tokenizers import loaded_tokenizer

# Served model -> (stack repository, route).
BASES = {
    "tiny-engine": ("bpe_current", "engine"),
    "tiny-ensemble": ("bpe_current", "ensemble"),
    "tiny-legacy": ("bpe_legacy", "ensemble"),
}
ADMIN_KEY = "admin-secret"
MAX_TOKENS = 10
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}
EVICTION_ADAPTERS = LORA_CACHE_ADAPTERS + 2
LLMAPI = "llmapi_current"


@pytest.fixture(scope="module")
def adapters(triton_stack: TritonStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """PEFT directories (the references load them) by adapter; the gateway gets `a1` as
    hf_lora_convert.py output and the others as PEFT directories."""
    model_dir = triton_stack.models["bpe_current"].tokenizer_dir
    root = tmp_path_factory.mktemp("lora")
    made = {
        "a1": make_peft_adapter(model_dir, root / "a1-peft", 101),
        # rsLoRA, fewer modules: alpha / sqrt(r) = 8 / 2.
        "a2": make_peft_adapter(
            model_dir,
            root / "a2",
            102,
            rank=4,
            alpha=8,
            use_rslora=True,
            modules=("q_proj", "v_proj", "down_proj"),
        ),
    }
    for i in range(EVICTION_ADAPTERS):
        made[f"e{i}"] = make_peft_adapter(model_dir, root / f"e{i}", 200 + i, rank=2, alpha=4)
    convert_like_hf_lora_convert(made["a1"], root / "a1")
    return made


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora-roots")


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, adapters: dict[str, Path], roots: Path) -> Iterator[GatewayProcess]:
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for name, (key, route) in BASES.items():
        m = triton_stack.models[key]
        args += [
            "--model",
            f"name={name},tokenizer={m.tokenizer_dir},route={route},triton_model={m.ensemble},"
            f"engine_model={m.engine}",
        ]
        converted = adapters["a1"].parent / "a1"
        args += [
            "--lora",
            f"{name}-a1={converted},base={name}",
            "--lora",
            f"{name}-a2={adapters['a2']},base={name}",
        ]
    args += ["--lora", f"my-adapter={adapters['a1'].parent / 'a1'},base=tiny-engine"]
    for i in range(EVICTION_ADAPTERS):
        args += ["--lora", f"e{i}={adapters[f'e{i}']},base=tiny-engine"]
    # TensorRT-LLM's llmapi model loads adapters itself from a path on the Triton server.
    llmapi = triton_stack.llmapi[LLMAPI]
    args += ["--model", f"name=tiny-llmapi,tokenizer={llmapi.tokenizer_dir},triton_model={llmapi.name}"]
    for name in ("a1", "a2"):
        args += [
            "--lora",
            f"tiny-llmapi-{name}={adapters[name]},base=tiny-llmapi,server_path={adapters[name]}",
        ]
    args += ["--lora", f"tiny-llmapi-nopath={adapters['a1']},base=tiny-llmapi"]
    args += ["--lora-dynamic-roots", str(roots), "--admin-api-keys", ADMIN_KEY]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def expected_text(triton_stack: TritonStack, adapter: Path | None, prompt: str) -> str:
    m = triton_stack.models["bpe_current"]
    tok = loaded_tokenizer(m.tokenizer_dir)
    return tok.decode(reference_greedy(m.tokenizer_dir, adapter, tok.encode(prompt), MAX_TOKENS))


def complete(sdk: openai.OpenAI, model: str, prompt: str, stream: bool) -> str:
    if stream:
        chunks = sdk.completions.create(model=model, prompt=prompt, stream=True, **GREEDY)  # type: ignore[call-overload]
        return "".join(c.choices[0].text for c in chunks if c.choices)
    out = sdk.completions.create(model=model, prompt=prompt, **GREEDY)  # type: ignore[call-overload]
    assert out.model == model and out.usage is not None and out.usage.completion_tokens == MAX_TOKENS
    return str(out.choices[0].text)


def gateway_metric(gateway: GatewayProcess, name: str, **labels: str) -> float:
    total = 0.0
    for line in http_client.get(gateway.base_url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("base", list(BASES))
def test_concurrent_base_and_adapter_requests_equal_transformers_and_peft(
    sdk: openai.OpenAI, triton_stack: TritonStack, adapters: dict[str, Path], base: str
) -> None:
    prompts = ["The quick brown fox", "emoji 🚀 café"]
    models = [(base, None), (f"{base}-a1", adapters["a1"]), (f"{base}-a2", adapters["a2"])]
    # Six requests (the base model and two adapters, two prompts), each streamed and not.
    cases = [
        (model, adapter, prompt, stream)
        for prompt in prompts
        for model, adapter in models
        for stream in (False, True)
    ]
    expected = {(a, p): expected_text(triton_stack, a, p) for _, a, p, _ in cases}
    # The adapters change the answers (else nothing here could fail).
    assert len({expected[(a, prompts[0])] for a in (None, adapters["a1"], adapters["a2"])}) == 3
    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(lambda c: complete(sdk, c[0], c[2], c[3]), cases))
    for (model, adapter, prompt, stream), answer in zip(cases, answers, strict=True):
        assert answer == expected[(adapter, prompt)], (model, prompt, stream)


def test_more_adapters_than_the_cache_holds_round_robin_all_succeed_and_reloads_are_counted(
    sdk: openai.OpenAI, gateway: GatewayProcess, triton_stack: TritonStack, adapters: dict[str, Path]
) -> None:
    names = [f"e{i}" for i in range(EVICTION_ADAPTERS)]
    prompt = "Once upon a time"
    expected = {n: expected_text(triton_stack, adapters[n], prompt) for n in names}
    assert len(set(expected.values())) == len(names)
    misses_before = sum(gateway_metric(gateway, "gateway_lora_cache_misses_total", model=n) for n in names)
    engine = triton_stack.models["bpe_current"].engine
    evictions_before = triton_stack.metric("trtllm_cpu_engine_lora_evictions_total", model=engine)
    order = names * 3
    # As many requests in flight as the cache holds adapters: each needs a slot, none is refused.
    with ThreadPoolExecutor(LORA_CACHE_ADAPTERS) as pool:
        answers = list(pool.map(lambda n: complete(sdk, n, prompt, False), order))
    assert answers == [expected[n] for n in order]
    misses = sum(gateway_metric(gateway, "gateway_lora_cache_misses_total", model=n) for n in names)
    # Every adapter was evicted and sent again at least once after its first load.
    assert misses - misses_before > len(names)
    # The engine evicted (its counters are published after its steps: poll for the last one).
    wanted = evictions_before + len(names) - LORA_CACHE_ADAPTERS
    deadline = time.monotonic() + 30
    while triton_stack.metric("trtllm_cpu_engine_lora_evictions_total", model=engine) < wanted:
        assert time.monotonic() < deadline, "the engine's evictions were not counted"
        time.sleep(0.05)
    assert gateway_metric(gateway, "gateway_requests_total", model="e0") >= 3


def test_openai_sdk_lists_the_adapter_with_its_parent_and_serves_it(
    sdk: openai.OpenAI, triton_stack: TritonStack, adapters: dict[str, Path]
) -> None:
    listed = {m.id: m for m in sdk.models.list().data}
    text: dict[str, Any] = {"input_modalities": ["text"]}
    assert listed["my-adapter"].model_extra == {"root": "tiny-engine", "parent": "tiny-engine", **text}
    assert listed["tiny-engine"].model_extra == {"root": "tiny-engine", "parent": None, **text}
    assert sdk.models.retrieve("my-adapter").model_extra["parent"] == "tiny-engine"  # type: ignore[index]
    messages = [{"role": "user", "content": "Hello"}]
    chat = sdk.chat.completions.create(model="my-adapter", messages=messages, **GREEDY)  # type: ignore[call-overload]
    base = sdk.chat.completions.create(model="tiny-engine", messages=messages, **GREEDY)  # type: ignore[call-overload]
    assert chat.model == "my-adapter" and chat.choices[0].message.content != base.choices[0].message.content
    streamed = sdk.chat.completions.create(model="my-adapter", messages=messages, stream=True, **GREEDY)  # type: ignore[call-overload]
    assert (
        "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        == chat.choices[0].message.content
    )
    # SGLang's BASE:ADAPTER spelling, and the Responses API.
    again = sdk.chat.completions.create(model="tiny-engine:my-adapter", messages=messages, **GREEDY)  # type: ignore[call-overload]
    assert again.choices[0].message.content == chat.choices[0].message.content
    response = sdk.responses.create(model="my-adapter", input="Hello", max_output_tokens=16, temperature=0)
    assert response.model == "my-adapter" and response.output_text
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="no-such-adapter", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"


def test_anthropic_sdk_on_messages_with_an_adapter(gateway: GatewayProcess) -> None:
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0)
    # Greedy, so the stream and the whole reply agree (this SDK version has no temperature argument).
    kwargs = {
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": "Hello"}],
        "extra_body": {"temperature": 0},
    }
    reply = client.messages.create(model="my-adapter", **kwargs)  # type: ignore[arg-type]
    assert reply.model == "my-adapter" and reply.content
    with client.messages.stream(model="my-adapter", **kwargs) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
    assert text == "".join(b.text for b in reply.content if b.type == "text")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="tiny-engine:../etc", **kwargs)  # type: ignore[arg-type]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def _admin(
    gateway: GatewayProcess, path: str, body: dict[str, object], key: str = ADMIN_KEY
) -> httpx.Response:
    return http_client.post(
        gateway.base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def test_dynamic_loading_and_hostile_inputs_get_clear_4xx_and_change_nothing(
    sdk: openai.OpenAI, gateway: GatewayProcess, adapters: dict[str, Path], roots: Path, tmp_path: Path
) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    before = sdk.chat.completions.create(model="my-adapter", messages=messages, **GREEDY)  # type: ignore[call-overload]
    inside = roots / "dyn"
    if not inside.exists():
        os.symlink(adapters["a2"], roots / "escape")  # a link out of the roots
        inside.mkdir()
        for file in adapters["a2"].iterdir():
            (inside / file.name).write_bytes(file.read_bytes())
        corrupt = roots / "corrupt"
        corrupt.mkdir()
        (corrupt / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16, "peft_type": "LORA"}')
        (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00not safetensors at all")
        links = roots / "links"
        links.mkdir()
        for file in adapters["a2"].iterdir():
            (links / file.name).symlink_to(file)
    # Hostile names on every API: 404 in each API's shape.
    for name in ("../../etc/passwd", "a/b", "tiny-engine:..", "tiny-engine:e0/../e1"):
        r = http_client.post(
            gateway.base_url + "/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 2}
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", name
        r = http_client.post(
            gateway.base_url + "/v1/responses", json={"model": name, "input": "x", "max_output_tokens": 16}
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", name
        r = http_client.post(
            gateway.base_url + "/v1/messages",
            json={"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", name
    refused = [
        ({"lora_name": "x", "lora_path": str(tmp_path)}, 400, "not inside the adapter roots"),
        ({"lora_name": "x", "lora_path": f"{roots}/dyn/../../etc"}, 400, "without '..'"),
        ({"lora_name": "x", "lora_path": "relative/dir"}, 400, "absolute path"),
        ({"lora_name": "x", "lora_path": str(roots / "escape")}, 400, "not inside the adapter roots"),
        ({"lora_name": "x", "lora_path": str(roots / "links")}, 400, "links outside the adapter roots"),
        ({"lora_name": "x", "lora_path": str(roots / "corrupt")}, 400, "not a readable safetensors file"),
        ({"lora_name": "../x", "lora_path": str(inside)}, 400, "is not allowed"),
        ({"lora_name": "my-adapter", "lora_path": str(inside)}, 400, "already been loaded"),
        ({"lora_name": "tiny-engine", "lora_path": str(inside)}, 400, "name of a served model"),
        ({"lora_name": "x", "lora_path": str(inside)}, 400, "base_model"),
    ]
    for body, status, needle in refused:
        if needle != "base_model":
            # Several models are served: each load names its base.
            body = {**body, "base_model": "tiny-engine"}
        r = _admin(gateway, "/v1/load_lora_adapter", body)
        assert r.status_code == status and needle in r.json()["error"]["message"], (body, r.text)
    assert (
        _admin(
            gateway, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(inside)}, "wrong"
        ).status_code
        == 401
    )
    assert "x" not in {m.id for m in sdk.models.list().data}
    # Nothing else was affected.
    after = sdk.chat.completions.create(model="my-adapter", messages=messages, **GREEDY)  # type: ignore[call-overload]
    assert after.choices[0].message.content == before.choices[0].message.content
    # A good one loads, serves, and unloads.
    ok = _admin(
        gateway,
        "/v1/load_lora_adapter",
        {"lora_name": "dyn", "lora_path": str(inside), "base_model": "tiny-engine"},
    )
    assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'dyn' added successfully."
    listed = {m.id: m for m in sdk.models.list().data}
    assert listed["dyn"].model_extra["parent"] == "tiny-engine"  # type: ignore[index]
    dyn = sdk.completions.create(model="dyn", prompt="Once upon a time", **GREEDY)  # type: ignore[call-overload]
    static = sdk.completions.create(model="tiny-engine-a2", prompt="Once upon a time", **GREEDY)  # type: ignore[call-overload]
    assert dyn.choices[0].text == static.choices[0].text  # the same weights: the same adapter
    assert _admin(gateway, "/v1/unload_lora_adapter", {"lora_name": "dyn"}).status_code == 200
    assert _admin(gateway, "/v1/unload_lora_adapter", {"lora_name": "dyn"}).status_code == 404
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="dyn", prompt="x", max_tokens=2)


def test_the_llmapi_model_loads_adapters_by_path_and_answers_as_peft(
    sdk: openai.OpenAI, triton_stack: TritonStack, adapters: dict[str, Path]
) -> None:
    m = triton_stack.llmapi[LLMAPI]
    tok = loaded_tokenizer(m.tokenizer_dir)
    prompt = "The quick brown fox"
    cases = [
        (f"tiny-llmapi{suffix}", adapter, stream)
        for suffix, adapter in (("", None), ("-a1", adapters["a1"]), ("-a2", adapters["a2"]))
        for stream in (False, True)
    ]

    def expected(adapter: Path | None) -> str:
        ids = reference_greedy(m.tokenizer_dir, adapter, tok.encode(prompt), MAX_TOKENS)
        # The llmapi model takes no ignore_eos: the reference ends where the model would.
        ends = {tok.info.eos_token_id, *tok.info.extra_end_ids}
        cut = next((i for i, t in enumerate(ids) if t in ends), len(ids))
        return tok.decode(ids[:cut])

    def ask(case: tuple[str, Path | None, bool]) -> str:
        model, _, stream = case
        common = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        if stream:
            return "".join(
                c.choices[0].text for c in sdk.completions.create(stream=True, **common) if c.choices
            )  # type: ignore[call-overload]
        return str(sdk.completions.create(**common).choices[0].text)  # type: ignore[call-overload]

    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(ask, cases))
    wanted = {a: expected(a) for a in (None, adapters["a1"], adapters["a2"])}
    assert len(set(wanted.values())) == 3
    for (model, adapter, stream), answer in zip(cases, answers, strict=True):
        assert answer == wanted[adapter], (model, stream)
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.completions.create(model="tiny-llmapi-nopath", prompt=prompt, max_tokens=4)
    assert refused.value.code == "lora_needs_server_path"
