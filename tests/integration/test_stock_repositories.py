"""The gateway over stock-faithful repositories, configured as the README says.

Every combination of {current, legacy} x {decoupled, not} x {byte-level BPE, SentencePiece}
repository (upstream's postprocessing, text-only ensembles, no guided decoding set up), each served
twice: by the default route (which finds the ensemble's tensorrt_llm step and goes to it) and by
`route=ensemble`. Text is compared with the tokenizer's own decoding of the ids transformers
generates greedily; usage and finish_reason with those ids' count.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.conftest import STOCK_LAYOUT, StackModel, TritonStack
from tests.integration.test_triton_stack import hf_greedy
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess, piped_env

pytestmark = pytest.mark.integration

MAX_TOKENS = 24
PROMPT = "你好 world 🎉"
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
ROUTES = ("default", "ensemble")
CASES = [(key, route) for key in STOCK_LAYOUT for route in ROUTES]


def served_name(key: str, route: str) -> str:
    return key if route == "default" else f"{key}-ensemble"


# Generation over gRPC ModelStreamInfer (no --triton-http-url) and over HTTP generate_stream.
@pytest.fixture(scope="module", params=["grpc", "http"])
def gateway(request: pytest.FixtureRequest, triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    if request.param == "http":
        args += ["--triton-http-url", triton_stack.http_url]
    for key, route in CASES:
        m = triton_stack.models[key]
        # As the README configures a model: a name, a tokenizer (and the prefixed ensemble's name).
        spec = f"name={served_name(key, route)},tokenizer={m.tokenizer_dir},triton_model={m.ensemble}"
        if route == "ensemble":
            spec += ",route=ensemble"
        args += ["--model", spec]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture(scope="module")
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@cache
def _tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def reference(model: StackModel) -> tuple[list[int], list[int]]:
    """The prompt's ids and transformers' greedy ids for it (MAX_TOKENS of them, no end id)."""
    tok = _tokenizer(model.tokenizer_dir)
    prompt = tok.encode(PROMPT)
    return prompt, hf_greedy(model.tokenizer_dir, tuple(prompt), MAX_TOKENS)


def exact_text(model: StackModel, ids: list[int]) -> str:
    return str(_tokenizer(model.tokenizer_dir).decode(ids, skip_special_tokens=True))


def streams_lossily(model: StackModel, route: str) -> bool:
    """Upstream's postprocessing decodes each streamed response alone: only a decoupled ensemble
    streams through it (a non-decoupled one answers whole; the default route sends ids)."""
    return route == "ensemble" and model.decoupled


def streamed_text(model: StackModel, route: str, ids: list[int]) -> str:
    if streams_lossily(model, route):
        # What the stock ensemble streams, joined: each token decoded on its own.
        return "".join(exact_text(model, [t]) for t in ids)
    return exact_text(model, ids)


def stream_completion(sdk: openai.OpenAI, **kwargs: Any) -> tuple[dict[int, str], dict[int, str], Any]:
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in sdk.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        if chunk.usage is not None:
            usage = chunk.usage
    return texts, finishes, usage


def test_the_reference_has_what_makes_text_hard(triton_stack: TritonStack) -> None:
    """The greedy continuations hold what stock streaming gets wrong: a character split across
    tokens (BPE), and SentencePiece spaces and byte-fallback runs that are not valid UTF-8."""
    for kind in ("bpe", "metaspace"):
        model = triton_stack.models[f"stock_{kind}_current_decoupled"]
        _, ids = reference(model)
        assert exact_text(model, ids) != streamed_text(model, "ensemble", ids), kind
    sp = triton_stack.models["stock_metaspace_current_decoupled"]
    _, ids = reference(sp)
    tok = _tokenizer(sp.tokenizer_dir)
    assert any(t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids))
    assert "\ufffd" in exact_text(sp, ids) and " " in exact_text(sp, ids)


@pytest.mark.parametrize(("key", "route"), CASES)
def test_text_usage_and_finish_reason_whole_and_streamed(
    sdk: openai.OpenAI, triton_stack: TritonStack, key: str, route: str
) -> None:
    model = triton_stack.models[key]
    prompt, ids = reference(model)
    name = served_name(key, route)

    whole = sdk.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, **GREEDY)
    assert whole.choices[0].text == exact_text(model, ids)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt), MAX_TOKENS)

    texts, finishes, usage = stream_completion(
        sdk, model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, **GREEDY
    )
    assert texts[0] == streamed_text(model, route, ids)
    assert finishes == {0: "length"}
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), MAX_TOKENS)


@pytest.mark.parametrize(("key", "route"), CASES)
def test_n_two_whole_and_streamed(
    sdk: openai.OpenAI, triton_stack: TritonStack, key: str, route: str
) -> None:
    model = triton_stack.models[key]
    _, ids = reference(model)
    name = served_name(key, route)

    whole = sdk.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, n=2, **GREEDY)
    assert sorted(c.index for c in whole.choices) == [0, 1]
    assert [c.text for c in whole.choices] == [exact_text(model, ids)] * 2
    assert [c.finish_reason for c in whole.choices] == ["length", "length"]
    assert whole.usage is not None and whole.usage.completion_tokens == 2 * MAX_TOKENS

    texts, finishes, usage = stream_completion(
        sdk, model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, n=2, **GREEDY
    )
    assert texts == dict.fromkeys((0, 1), streamed_text(model, route, ids))
    assert finishes == {0: "length", 1: "length"}
    assert usage.completion_tokens == 2 * MAX_TOKENS


def stop_string(text: str) -> str:
    """Two characters from the middle of the text that do not occur earlier in it."""
    for start in range(len(text) // 3, len(text) - 2):
        candidate = text[start : start + 2]
        if "\ufffd" not in candidate and candidate.strip() and text.index(candidate) == start:
            return candidate
    raise AssertionError(f"no stop string found in {text!r}")


@pytest.mark.parametrize(("key", "route"), CASES)
def test_a_stop_string_cuts_the_text_there(
    sdk: openai.OpenAI, triton_stack: TritonStack, key: str, route: str
) -> None:
    model = triton_stack.models[key]
    _, ids = reference(model)
    name = served_name(key, route)
    text = exact_text(model, ids)
    stop = stop_string(text)

    whole = sdk.completions.create(model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, stop=[stop], **GREEDY)
    assert whole.choices[0].text == text[: text.index(stop)]
    assert whole.choices[0].finish_reason == "stop"

    streamed = streamed_text(model, route, ids)
    if stop in streamed:
        texts, finishes, _ = stream_completion(
            sdk, model=name, prompt=PROMPT, max_tokens=MAX_TOKENS, stop=[stop], **GREEDY
        )
        assert texts[0] == streamed[: streamed.index(stop)]
        assert finishes == {0: "stop"}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("variant", ["current", "legacy"])
def test_guided_decoding_not_set_up_is_a_400_naming_the_parameter(
    gateway: GatewayProcess, variant: str, route: str
) -> None:
    # Engines rendered as upstream's quick start leaves them: guided_decoding_backend unset.
    name = served_name(f"stock_bpe_{variant}_whole", route)
    messages = [{"role": "user", "content": "Hi"}]
    r = http_client.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": name, "messages": messages, "response_format": {"type": "json_object"}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = http_client.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": name, "messages": messages, "tools": [tool], "tool_choice": "required"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] in ("tools", "tool_choice")


def test_a_lossy_streamed_ensemble_is_reported_at_start_up_with_the_fix(
    gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    # The whole log: the start-up report of some forty models is longer than log_text()'s tail.
    log = gateway.log.read_text(errors="replace")
    for key, (_, _, decoupled, _) in STOCK_LAYOUT.items():
        # Served twice: only the route=ensemble entry streams through the stock postprocessing.
        warning = f"streamed text through ensemble {triton_stack.models[key].ensemble} is lossy"
        assert log.count(warning) == (1 if decoupled else 0), key
    assert "(route=ensemble configured)" in log and "Fix: use the engine route" in log


def test_gateway_check_reports_route_streamed_text_and_guided_decoding(triton_stack: TritonStack) -> None:
    args = [sys.executable, "-m", "gateway.cli", "check", "--triton-url", triton_stack.grpc_url]
    keys = ["stock_metaspace_current_whole", "stock_metaspace_legacy_decoupled", "stock_bpe_legacy_whole"]
    for key in keys:
        m = triton_stack.models[key]
        for route in ROUTES:
            spec = f"name={served_name(key, route)},tokenizer={m.tokenizer_dir},triton_model={m.ensemble}"
            args += ["--model", spec + (",route=ensemble" if route == "ensemble" else "")]
    # Read as a pipe with no width limit reads it, the check is one table.
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, env=piped_env())
    assert out.returncode == 0, out.stdout + out.stderr
    (header,) = [line for line in out.stdout.splitlines() if line.count("┃") > 5]
    names = [c.strip() for c in header.split("┃")[1:-1]]
    lines = [line for line in out.stdout.splitlines() if line.count("│") > 5]
    rows = {}
    for line in lines:
        row = dict(zip(names, (c.strip() for c in line.split("│")[1:-1]), strict=True))
        rows[row["model"]] = row
    for key in keys:
        m = triton_stack.models[key]
        default, ensemble = rows[key], rows[f"{key}-ensemble"]
        assert (default["route"], default["triton model"]) == ("engine", m.engine)
        assert (ensemble["route"], ensemble["triton model"]) == ("ensemble", m.ensemble)
        assert default["streamed text"] == "exact"
        assert ensemble["streamed text"].startswith("LOSSY" if m.decoupled else "exact")
        assert default["usage from"] == "token ids"
        assert default["n"] == (
            "num_return_sequences" if m.decoupled and m.variant == "current" else "fan-out"
        )
        # The stock quick start leaves guided_decoding_backend unset: declared inputs are not enough.
        expected_guided = "no (guided_decoding_backend not set up)" if m.variant == "current" else "no"
        assert default["guided"] == ensemble["guided"] == expected_guided
    assert rows["stock_bpe_legacy_whole-ensemble"]["usage from"] == "output_log_probs"
    assert rows["stock_metaspace_current_whole-ensemble"]["usage from"] == "num_output_tokens"
    key = "stock_metaspace_legacy_decoupled"
    reason = f"{key}: engine route: Triton serves {key}_ensemble's tensorrt_llm step {key}_tensorrt_llm"
    assert reason in out.stdout
    assert "stock_bpe_legacy_whole-ensemble: ensemble route: route=ensemble configured" in out.stdout
