"""The gateway over CPU stand-ins of TensorRT-LLM's llmapi model (current and 1.2.x model.py,
decoupled and not), configured as a new user would: a name, a tokenizer, the Triton model.

Every API, streamed and not, with the official clients (the conformance and client tests of the
C++ path run over `llmapi_current` too: test_gateway_e2e.py, test_messages_sdk.py,
test_responses_clients.py, test_tool_call_streaming.py, test_reasoning_clients.py). Text is
compared with what the stand-in itself returns for the same prompt (its tokenizer's decoding of
what it generated), stop strings with that text cut, cancellation with the stand-in's own counters.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import openai
import pytest

from tests.integration.conftest import LLMAPI_LAYOUT, LlmapiModel, TritonStack, stream_infer
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess, free_port
from tests.support.openai_schema import validate

pytestmark = pytest.mark.integration

MODELS = tuple(LLMAPI_LAYOUT)
MAX_TOKENS = 12
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": MAX_TOKENS}
USER = [{"role": "user", "content": "Tell me about the weather."}]


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for key, m in triton_stack.llmapi.items():
        args += ["--model", f"name={key},tokenizer={m.tokenizer_dir},triton_model={m.name}"]
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


def stand_in_text(stack: TritonStack, model: LlmapiModel, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    """What the stand-in itself answers (greedy, the prompt left out): its tokenizer's decoding of
    the ids it generated."""
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=object),
        "sampling_param_max_tokens": np.array([max_tokens], dtype=np.int32),
        "sampling_param_temperature": np.array([0.0], dtype=np.float32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
        "sampling_param_exclude_input_from_output": np.array([True]),
    }
    responses = stream_infer(stack.grpc_url, model.name, inputs)
    assert responses[-1].error is None, responses[-1].error
    texts = [r.outputs["text_output"][0] for r in responses if "text_output" in r.outputs]
    return str(texts[-1].decode())


def chat_prompt(model: LlmapiModel) -> str:
    return str(
        _tokenizer(model.tokenizer_dir).apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    )


@pytest.mark.parametrize("key", MODELS)
def test_chat_completions_stream_the_text_the_model_generates(
    key: str, triton_stack: TritonStack, sdk: openai.OpenAI
) -> None:
    m = triton_stack.llmapi[key]
    expected = stand_in_text(triton_stack, m, chat_prompt(m))
    whole = sdk.chat.completions.create(model=key, messages=USER, **GREEDY)  # type: ignore[arg-type]
    stream = sdk.chat.completions.create(
        model=key,
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed == expected
    assert whole.choices[0].finish_reason == "length"  # the random tiny model never ends by itself
    usage = chunks[-1].usage
    assert usage is not None and whole.usage is not None
    prompt_ids = _tokenizer(m.tokenizer_dir).encode(chat_prompt(m))
    assert usage.prompt_tokens == whole.usage.prompt_tokens == len(prompt_ids)
    # The model says it stopped at max_tokens: exactly that many were generated.
    assert usage.completion_tokens == whole.usage.completion_tokens == MAX_TOKENS


# The current decoupled model: test_gateway_e2e.py, beside the C++ path.
@pytest.mark.parametrize("key", ["llmapi_v12_whole"])
def test_completions_stop_strings_cut_the_text_exactly(
    key: str, triton_stack: TritonStack, sdk: openai.OpenAI
) -> None:
    m = triton_stack.llmapi[key]
    full = stand_in_text(triton_stack, m, "Once upon a time", 24)
    # A stop string from the middle of what the model writes (not at its very start).
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    cut = full[: full.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(
                sdk.completions.create(
                    model=key,
                    prompt="Once upon a time",
                    stop=[stop],
                    stream=True,
                    temperature=0,
                    max_tokens=24,
                )
            )
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            result = sdk.completions.create(
                model=key, prompt="Once upon a time", stop=[stop], temperature=0, max_tokens=24
            )
            text, reason = result.choices[0].text, result.choices[0].finish_reason
        assert (text, reason) == (cut, "stop")


def test_n_is_several_requests_with_their_own_seeds(sdk: openai.OpenAI) -> None:
    result = sdk.completions.create(model="llmapi_current", prompt="Hello", n=3, seed=7, max_tokens=8)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert len({c.text for c in result.choices}) > 1, result.choices
    again = sdk.completions.create(model="llmapi_current", prompt="Hello", n=3, seed=7, max_tokens=8)
    assert [c.text for c in again.choices] == [c.text for c in result.choices]


@pytest.mark.parametrize("key", ["llmapi_current", "llmapi_v12_whole"])
def test_messages_and_responses_over_the_llmapi_model(
    key: str, triton_stack: TritonStack, gateway: GatewayProcess, sdk: openai.OpenAI
) -> None:
    m = triton_stack.llmapi[key]
    expected = stand_in_text(triton_stack, m, chat_prompt(m), 16)
    with anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0) as client:
        message = client.messages.create(
            model=key, messages=USER, max_tokens=16, extra_body={"temperature": 0}
        )  # type: ignore[arg-type]
        with client.messages.stream(
            model=key, messages=USER, max_tokens=16, extra_body={"temperature": 0}
        ) as stream:  # type: ignore[arg-type]
            streamed = "".join(stream.text_stream)
    assert message.content[0].text == streamed == expected  # type: ignore[union-attr]
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 16
    response = sdk.responses.create(model=key, input=USER, max_output_tokens=16, temperature=0)  # type: ignore[arg-type]
    assert response.output_text == expected
    events = list(
        sdk.responses.create(model=key, input=USER, max_output_tokens=16, temperature=0, stream=True)  # type: ignore[arg-type]
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
            "tool_choice",
        ),
        ({"min_tokens": 2}, "min_tokens"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"top_logprobs": 2, "logprobs": True}, "logprobs"),
    ],
)
def test_what_the_llmapi_model_cannot_do_is_a_400_naming_the_parameter(
    body: dict[str, Any], param: str, gateway: GatewayProcess
) -> None:
    r = http_client.post(
        gateway.base_url + "/v1/chat/completions",
        json={"model": "llmapi_current", "messages": USER, "max_tokens": 4, **body},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == param


def test_a_too_long_prompt_is_refused_before_it_is_sent(gateway: GatewayProcess) -> None:
    r = http_client.post(
        gateway.base_url + "/v1/completions",
        json={"model": "llmapi_current", "prompt": "hello " * 2000, "max_tokens": 4},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "context_length_exceeded"


def _sum(stack: TritonStack, name: str, model: str) -> float:
    return stack.metric(name, model=model)


@pytest.mark.parametrize("key", ["llmapi_current", "llmapi_current_whole"])
def test_a_dropped_stream_is_cancelled_in_the_model(
    key: str, triton_stack: TritonStack, gateway: GatewayProcess
) -> None:
    body = json.dumps({"model": key, "prompt": "Hello", "max_tokens": 400, "stream": True}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    # The tiny model may finish a request between two reads of Triton's metrics (it is done in
    # under a second on an idle machine): such an attempt shows nothing about cancellation and is
    # made again. One attempt must be seen generating, dropped, and cancelled in the model.
    for _ in range(5):
        cancelled = _sum(triton_stack, "llmapi_stand_in_cancelled_requests_total", key)
        completed = _sum(triton_stack, "llmapi_stand_in_completed_requests_total", key)

        def finished(completed: float = completed) -> bool:
            return _sum(triton_stack, "llmapi_stand_in_completed_requests_total", key) > completed

        with socket.create_connection(("127.0.0.1", gateway.port), timeout=60) as conn:
            conn.sendall(head + body)
            # The client goes away once the model is generating (a model that answers once has
            # sent nothing yet; a streaming one may have).
            started = time.monotonic()
            while _sum(triton_stack, "llmapi_stand_in_active_requests", key) < 1 and not finished():
                assert time.monotonic() - started < 60, "the request never reached the model"
                time.sleep(0.02)
        dropped = time.monotonic()
        while _sum(triton_stack, "llmapi_stand_in_cancelled_requests_total", key) == cancelled:
            if finished():
                break
            # The model polls for cancellation every 100 ms; a second is plenty, ten for a loaded
            # machine.
            assert time.monotonic() - dropped < 10, "the llmapi model never saw the cancellation"
            time.sleep(0.02)
        else:
            assert _sum(triton_stack, "llmapi_stand_in_active_requests", key) == 0
            return
    pytest.fail("every attempt finished before it could be dropped")


def test_a_model_the_gateway_cannot_serve_is_one_line_before_the_port_is_bound(
    triton_stack: TritonStack,
) -> None:
    # A preprocessing model: Triton serves it, but it speaks neither contract.
    m = triton_stack.models["bpe_current"]
    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(port),
            "--triton-url",
            triton_stack.grpc_url,
            "--model",
            f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.preprocessing}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("gateway serve: model 'tiny': Triton model") and m.preprocessing in line
    assert "inputs QUERY" in line and "llmapi" in line and "ensemble" in line
    assert "Traceback" not in done.stderr + done.stdout


def test_the_stand_in_keeps_upstreams_defaults(triton_stack: TritonStack) -> None:
    # What a client that sends only text_input gets: 32 tokens, the prompt echoed, string reasons.
    m = triton_stack.llmapi["llmapi_current_whole"]
    prompt = "Once upon a time"
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=object),
        "sampling_param_temperature": np.array([0.0], dtype=np.float32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
        "return_finish_reason": np.array([True]),
    }
    (response,) = stream_infer(triton_stack.grpc_url, m.name, inputs)
    text = response.outputs["text_output"][0].decode()
    assert text == prompt + stand_in_text(triton_stack, m, prompt, 32)
    assert response.outputs["finish_reason"][0] == b"length"


def test_a_stop_request_cancels_the_request_with_its_id(triton_stack: TritonStack) -> None:
    m = triton_stack.llmapi["llmapi_current"]
    stopped: list[Any] = []

    def stop_once(response: Any, client: Any) -> bool:
        if not stopped:
            # The stop request's own answer is a CANCELLED error.
            stopped.append(
                stream_infer(
                    triton_stack.grpc_url,
                    m.name,
                    {"text_input": np.array([b""], dtype=object), "stop": np.array([True])},
                    request_id="llmapi-stop-test",
                )
            )
        return False

    inputs = {
        "text_input": np.array([b"Hello"], dtype=object),
        "streaming": np.array([True]),
        "sampling_param_max_tokens": np.array([400], dtype=np.int32),
        "return_finish_reason": np.array([True]),
    }
    responses = stream_infer(
        triton_stack.grpc_url, m.name, inputs, request_id="llmapi-stop-test", on_response=stop_once
    )
    ((answer,),) = stopped
    assert answer.error is not None and "Request cancelled by client" in answer.error
    # The current model.py completes a stopped request, well before its 400 tokens.
    assert responses[-1].final and responses[-1].outputs["finish_reason"][0] == b"cancelled"
    assert len(responses) < 400


def test_a_repeated_prompt_reports_its_cached_tokens(sdk: openai.OpenAI) -> None:
    # The stand-in's config tells the block size (tokens_per_block); its KV cache reuses blocks.
    messages = [{"role": "user", "content": "A long shared system prompt about the weather. " * 4}]
    first = sdk.chat.completions.create(model="llmapi_current", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    again = sdk.chat.completions.create(model="llmapi_current", messages=messages, max_tokens=2)  # type: ignore[arg-type]
    assert first.usage is not None and again.usage is not None
    details = again.usage.prompt_tokens_details
    # Both usages in the message: a repeat that reports nothing cached has been seen once, its cause
    # not found (the stand-in's KV blocks, Triton and the gateway each repeated alone never missed).
    assert details is not None and details.cached_tokens, (first.usage, again.usage)
    assert 0 < details.cached_tokens <= again.usage.prompt_tokens
