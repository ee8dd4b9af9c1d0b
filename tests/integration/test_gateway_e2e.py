"""The gateway against the real local Triton stack, through official clients: the C++ repository's
routes and, beside them, the CPU stand-in of TensorRT-LLM's llmapi model, configured as a new user
would (a name, a tokenizer, the Triton model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.integration.conftest import TritonStack, llmapi_model_spec
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess, piped_env
from tests.support.openai_schema import validate
from tests.support.tokenizers import loaded_tokenizer

pytestmark = pytest.mark.integration

# served name -> (stack key, route)
SERVED = {
    "tiny": ("bpe_current", "ensemble"),
    "tiny-legacy": ("bpe_legacy", "ensemble"),
    "tiny-sp": ("metaspace_current", "ensemble"),
    "tiny-stock": ("bpe_stock", "ensemble"),
    "tiny-synthetic": ("bpe_synthetic", "ensemble"),
    "tiny-engine": ("bpe_current", "engine"),
    # The same tiny model as `tiny`, behind the llmapi model's contract.
    "tiny-llmapi": ("llmapi_current", "llmapi"),
}
LLMAPI = "tiny-llmapi"
GREEDY = {"temperature": 0}
PROMPTS = [
    "Hello, how are you?",
    "你好，世界！请介绍一下自己。",
    "Emoji time 🎉🚀 and café",
    "日本語のテキスト",
]


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for name, (key, route) in SERVED.items():
        if route == "llmapi":
            args += ["--model", llmapi_model_spec(triton_stack, name, key)]
            continue
        m = triton_stack.models[key]
        spec = f"name={name},tokenizer={m.tokenizer_dir},route={route}"
        spec += f",triton_model={m.ensemble},engine_model={m.engine}"
        args += ["--model", spec]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


def to_the_limit(model: str) -> dict[str, object]:
    """What makes the random model write exactly `max_tokens` tokens: ignore_eos on the C++ path.
    The llmapi contract has no ignore_eos (a 400, test_llmapi.py); the greedy prompts here do not
    make the tiny model end by itself there."""
    return {} if model == LLMAPI else {"ignore_eos": True}


def tokenizer_dir(stack: TritonStack, model: str) -> Path:
    key, route = SERVED[model]
    return stack.llmapi[key].tokenizer_dir if route == "llmapi" else stack.models[key].tokenizer_dir


def chat_stream(sdk: openai.OpenAI, **kwargs: object) -> tuple[dict[int, str], dict[int, str], list[dict]]:
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    chunks = []
    for chunk in sdk.chat.completions.create(stream=True, **kwargs):  # type: ignore[call-overload]
        body = chunk.model_dump(exclude_unset=True)
        chunks.append(body)
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    return texts, finishes, chunks


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_openai_sdk_chat_and_completions_validate_against_the_official_schemas(
    gateway: GatewayProcess, model: str
) -> None:
    base = gateway.base_url
    messages = [{"role": "user", "content": "Say something"}]
    r = http_client.post(
        f"{base}/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 8}
    )
    validate("CreateChatCompletionResponse", r.json())
    r = http_client.post(f"{base}/v1/completions", json={"model": model, "prompt": "Once", "max_tokens": 8})
    validate("CreateCompletionResponse", r.json())
    validate("ListModelsResponse", http_client.get(f"{base}/v1/models").json())
    for path, body, schema in (
        (
            "/v1/chat/completions",
            {"model": model, "messages": messages},
            "CreateChatCompletionStreamResponse",
        ),
        ("/v1/completions", {"model": model, "prompt": "Once"}, "CreateCompletionResponse.stream"),
    ):
        payload = {**body, "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}, "n": 2}
        with http_client.stream("POST", base + path, json=payload) as r:
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for event in events[:-2]:
            validate(schema, json.loads(event))
        usage_chunk = json.loads(events[-2])
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_openai_sdk_invoke_and_stream(sdk: openai.OpenAI, model: str) -> None:
    out = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, **GREEDY
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    assert (
        out.usage is not None
        and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    )
    texts, finishes, _ = chat_stream(
        sdk, model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=12, **GREEDY
    )
    assert texts[0] == out.choices[0].message.content
    assert finishes[0] == out.choices[0].finish_reason
    completion = sdk.completions.create(model=model, prompt="Once upon a time", max_tokens=5, **GREEDY)
    assert completion.usage is not None and completion.usage.completion_tokens <= 5


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_langchain_chat_openai_invokes_and_streams(gateway: GatewayProcess, model: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=gateway.base_url + "/v1", api_key="unused", model=model, temperature=0, max_tokens=10
    )
    message = llm.invoke("Hello there")
    streamed = "".join(str(chunk.content) for chunk in llm.stream("Hello there"))
    assert streamed == message.content
    assert message.response_metadata["finish_reason"] in ("stop", "length")
    assert message.usage_metadata is not None and message.usage_metadata["output_tokens"] > 0


@pytest.mark.parametrize("model", ["tiny", "tiny-sp", "tiny-stock", "tiny-legacy", "tiny-engine", LLMAPI])
def test_greedy_stream_equals_non_stream_text_for_unicode_prompts(sdk: openai.OpenAI, model: str) -> None:
    # The random model must not end early, so there is real text to compare.
    common = {"model": model, "max_tokens": 24, "extra_body": to_the_limit(model), **GREEDY}
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        full = sdk.chat.completions.create(messages=messages, **common)  # type: ignore[call-overload]
        assert full.usage is not None and full.usage.completion_tokens == 24
        assert full.choices[0].message.content and full.choices[0].finish_reason == "length"
        texts, finishes, _ = chat_stream(sdk, messages=messages, **common)
        assert texts[0] == full.choices[0].message.content, prompt
        assert finishes[0] == full.choices[0].finish_reason
        completion = sdk.completions.create(prompt=prompt, **common)  # type: ignore[call-overload]
        assert completion.choices[0].text
        chunks = sdk.completions.create(prompt=prompt, stream=True, **common)  # type: ignore[call-overload]
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        assert streamed == completion.choices[0].text, prompt


def reference_greedy_ids(model_dir: Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """transformers' own greedy generate for exactly `max_tokens` tokens (no end id)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0
        )
    generated = out[0, len(prompt_ids) :].tolist()
    assert len(generated) == max_tokens
    return generated


@pytest.mark.parametrize("model", ["tiny", "tiny-sp", "tiny-stock", "tiny-legacy", "tiny-engine", LLMAPI])
def test_greedy_text_equals_transformers_generate(
    sdk: openai.OpenAI, triton_stack: TritonStack, model: str
) -> None:
    from gateway.text.detokenizer import ids_decoder

    model_dir = tokenizer_dir(triton_stack, model)
    tok = loaded_tokenizer(model_dir)
    for prompt in ("你好 world 🎉", "The quick brown fox", "Once upon a time", "emoji 🚀 café"):
        prompt_ids = tok.encode(prompt)
        ids = reference_greedy_ids(model_dir, prompt_ids, 20)
        got = sdk.completions.create(
            model=model, prompt=prompt, max_tokens=20, extra_body=to_the_limit(model), **GREEDY
        )
        assert got.usage is not None and got.usage.prompt_tokens == len(prompt_ids)
        assert got.usage.completion_tokens == 20
        # transformers' ids, detokenized one at a time as a stream would be, and decoded whole by
        # the tokenizer: the same text, invalid UTF-8 from byte-fallback tokens included.
        detok = ids_decoder(tok)
        expected = "".join(detok.push_ids([t]) for t in ids) + detok.flush()
        assert got.choices[0].text == expected == tok.decode(ids), prompt


def test_n_two_gives_indexes_0_and_1_and_a_seed_reproduces_sampling(sdk: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    # native num_return_sequences, fan-out, and the llmapi model's requests with seeds seed + i
    for model in ("tiny", "tiny-legacy", LLMAPI):
        out = sdk.chat.completions.create(
            model=model, messages=messages, n=2, max_tokens=10, temperature=1.0, seed=5
        )  # type: ignore[arg-type]
        assert sorted(c.index for c in out.choices) == [0, 1]
        again = sdk.chat.completions.create(
            model=model, messages=messages, n=2, max_tokens=10, temperature=1.0, seed=5
        )  # type: ignore[arg-type]
        assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]
        texts, _, _ = chat_stream(
            sdk, model=model, messages=messages, n=2, max_tokens=10, temperature=1.0, seed=5
        )
        assert sorted(texts) == [0, 1]
    samples = {
        sdk.completions.create(model="tiny", prompt="Pick", max_tokens=12, temperature=1.0, seed=s)
        .choices[0]
        .text
        for s in range(4)
    }
    assert len(samples) > 1, "different seeds should sample different texts"


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
def test_a_stop_string_from_the_middle_of_the_answer_cuts_exactly_before_it(
    sdk: openai.OpenAI, model: str
) -> None:
    base = sdk.completions.create(
        model=model, prompt="The story begins", max_tokens=40, extra_body=to_the_limit(model), **GREEDY
    )
    text = base.choices[0].text
    assert base.choices[0].finish_reason == "length" and base.usage and base.usage.completion_tokens == 40
    start = len(text) // 2
    stop = text[start : start + 3]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(
                sdk.completions.create(
                    model=model,
                    prompt="The story begins",
                    max_tokens=40,
                    stop=[stop],
                    stream=True,
                    extra_body=to_the_limit(model),
                    **GREEDY,
                )
            )  # type: ignore[call-overload]
            got = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][
                -1
            ]
        else:
            out = sdk.completions.create(
                model=model,
                prompt="The story begins",
                max_tokens=40,
                stop=stop,
                extra_body=to_the_limit(model),
                **GREEDY,
            )
            got, reason = out.choices[0].text, out.choices[0].finish_reason
        assert got == expected
        assert reason == "stop"


def test_max_tokens_one_gives_one_token_and_length(sdk: openai.OpenAI) -> None:
    for model in SERVED:
        out = sdk.completions.create(
            model=model, prompt="Hello", max_tokens=1, extra_body=to_the_limit(model), **GREEDY
        )
        assert out.choices[0].finish_reason == "length", model
        assert out.usage is not None and out.usage.completion_tokens == 1, model


@pytest.mark.parametrize("other", ["tiny-engine", LLMAPI])
def test_the_ensemble_route_the_engine_route_and_the_llmapi_model_agree(
    sdk: openai.OpenAI, other: str
) -> None:
    # The same tiny model behind each: the same greedy text, reason and counts.
    for prompt in PROMPTS:
        a = sdk.completions.create(model="tiny", prompt=prompt, max_tokens=16, **GREEDY)
        b = sdk.completions.create(model=other, prompt=prompt, max_tokens=16, **GREEDY)
        assert a.choices[0].text == b.choices[0].text
        assert a.choices[0].finish_reason == b.choices[0].finish_reason
        assert a.usage is not None and b.usage is not None
        if other == LLMAPI:
            # Its own KV cache: what it holds of the prompt depends on what it served before.
            assert a.usage.model_dump(exclude={"prompt_tokens_details"}) == b.usage.model_dump(
                exclude={"prompt_tokens_details"}
            )
        else:
            assert a.usage == b.usage


@pytest.mark.parametrize("model", ["tiny", LLMAPI])
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "nope", "prompt": "x"}, 404, "model_not_found"),
        ({"prompt": "word " * 600}, 400, "context_length_exceeded"),
        ({"prompt": "x", "max_tokens": -1}, 400, None),
        ({"prompt": "x", "temperature": 9}, 400, None),
    ],
)
def test_bad_requests_are_openai_errors(
    gateway: GatewayProcess, model: str, body: dict, status: int, code: str | None
) -> None:
    r = http_client.post(gateway.base_url + "/v1/completions", json={"model": model, **body})
    assert r.status_code == status
    validate("ErrorResponse", r.json())
    assert r.json()["error"]["code"] == code


def test_gateway_check_reports_what_each_model_supports(triton_stack: TritonStack) -> None:
    import subprocess
    import sys

    args = [sys.executable, "-m", "gateway.cli", "check", "--triton-url", triton_stack.grpc_url]
    for name in ("tiny", "tiny-legacy", "tiny-stock", "tiny-engine"):
        key, route = SERVED[name]
        m = triton_stack.models[key]
        args += ["--model", f"name={name},tokenizer={m.tokenizer_dir},route={route}"]
        args[-1] += f",triton_model={m.ensemble},engine_model={m.engine}"
    args += [
        "--model",
        f"name=missing,tokenizer={triton_stack.models['bpe_current'].tokenizer_dir},triton_model=nope",
    ]
    # Read as a pipe with no width limit reads it, the check is one table.
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=piped_env())
    assert out.returncode == 1  # one model is not in Triton
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[1:-1]]
        for line in out.stdout.splitlines()
        if line.count("│") > 5
    }
    assert rows["tiny"][3:10] == [
        "ready",
        "current",
        "yes",
        "yes",
        "num_return_sequences",
        "yes (xgrammar)",
        "top-k",
    ]
    assert rows["tiny-legacy"][3:7] == ["ready", "legacy", "yes", "yes"]
    assert rows["tiny-stock"][6] == "no"  # no output_ids: text is reassembled from bytes
    assert rows["tiny-engine"][2] == "engine"
    assert rows["missing"][3].startswith("unavailable")


def test_the_gateway_logs_the_same_summary_at_start_up(triton_stack: TritonStack) -> None:
    m = triton_stack.models["bpe_legacy"]
    spec = f"name=tiny-legacy,tokenizer={m.tokenizer_dir},triton_model={m.ensemble}"
    with GatewayProcess(
        ["--triton-url", triton_stack.grpc_url, "--model", spec, "--log-level", "info"]
    ) as gw:
        log = gw.log_text()
    assert "what each model supports" in log and "tiny-legacy" in log and "legacy" in log
