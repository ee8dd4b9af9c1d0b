"""The llmapi model's contract, each behaviour checked once: against the CPU stand-in itself (gRPC,
as a client of upstream's model sees it), and the gateway's answers to what upstream's model does
wrong (errors it never answers, bounded by the gateway's silence limit).

The stand-in must behave as upstream's model.py: stop strings matched on token ids (sent as bytes),
cumulative streamed text with "None" reasons until the end, 1.2.x's single response per stream, the
closed stream cancelled by the model's polling, INTERNAL errors with the model's prefix, and no
answer at all from the current model.py for errors raised before it registers a request.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import TritonStack, _infer_input, stream_infer
from tests.support import http_client
from tests.support.anthropic_errors import assert_error
from tests.support.gateway_process import GatewayProcess
from tests.support.lora import write_numpy_adapter

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time"
# How long the gateway waits for a silent llmapi request here: long enough for the stand-in's
# first step on a loaded machine, short enough to keep the test cheap.
IDLE_S = 6.0


def _strings(*values: bytes) -> np.ndarray:
    return np.array(list(values), dtype=object)


def _greedy(max_tokens: int, **extra: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "text_input": _strings(PROMPT.encode()),
        "sampling_param_max_tokens": np.array([max_tokens], dtype=np.int32),
        "sampling_param_temperature": np.array([0.0], dtype=np.float32),
        "sampling_param_top_k": np.array([1], dtype=np.int32),
        "sampling_param_exclude_input_from_output": np.array([True]),
        "return_finish_reason": np.array([True]),
        "return_stop_reason": np.array([True]),
        **extra,
    }


def _out(response: Any, name: str) -> str:
    return str(response.outputs[name][0].decode())


def _steps(stack: TritonStack, max_tokens: int) -> list[str]:
    """The current stand-in's cumulative text after each generated token (greedy): one response a
    step, then a final one repeating the whole text."""
    responses = stream_infer(
        stack.grpc_url, "llmapi_current", _greedy(max_tokens, streaming=np.array([True]))
    )
    assert responses[-1].error is None and responses[-1].final, responses[-1].error
    steps = [_out(r, "text_output") for r in responses[:-1]]
    assert _out(responses[-1], "text_output") == steps[-1]
    return steps


def _extends(before: str, after: str) -> bool:
    # A trailing U+FFFD is an incomplete character that the next step may complete; a step may add
    # no text (a token that decodes to nothing alone).
    return after.startswith(before.rstrip("\ufffd"))


@pytest.fixture(scope="module")
def tokenizer(triton_stack: TritonStack) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(triton_stack.llmapi["llmapi_current"].tokenizer_dir)


def test_stop_strings_sent_as_bytes_are_matched_on_the_generated_token_ids(
    triton_stack: TritonStack, tokenizer: Any
) -> None:
    steps = _steps(triton_stack, 24)
    assert len(steps) == 24
    # The text each step added, where it is whole characters.
    pieces = [
        b[len(a) :] if b.startswith(a) and "\ufffd" not in b[len(a) :] else ""
        for a, b in zip(["", *steps], steps, strict=False)
    ]

    def one_token(text: str) -> bool:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return len(ids) == 1 and tokenizer.decode(ids) == text

    # A token from the middle that is its own stop string: the output ends before its first
    # occurrence, the stop string left out, and says which stop string matched.
    k = next(i for i in range(len(pieces) // 2, len(pieces)) if pieces[i].strip() and one_token(pieces[i]))
    stop = pieces[k]
    first = pieces.index(stop)
    (whole,) = stream_infer(
        triton_stack.grpc_url,
        "llmapi_current_whole",
        _greedy(24, sampling_param_stop=_strings(stop.encode())),
    )
    assert (_out(whole, "text_output"), _out(whole, "finish_reason"), _out(whole, "stop_reason")) == (
        steps[first - 1] if first else "",
        "stop",
        stop,
    )
    # Text that starts inside one generated token and ends in the next: present in the text, but
    # its own tokens were never generated, so it stops nothing (the gateway matches stop strings on
    # the text itself).
    spanning = next(
        pieces[i][1:] + pieces[i + 1]
        for i in range(len(pieces) - 1)
        if len(pieces[i]) > 1 and one_token(pieces[i]) and pieces[i + 1].strip()
    )
    assert spanning in steps[-1]
    (whole,) = stream_infer(
        triton_stack.grpc_url,
        "llmapi_current_whole",
        _greedy(24, sampling_param_stop=_strings(spanning.encode())),
    )
    assert (_out(whole, "text_output"), _out(whole, "finish_reason"), _out(whole, "stop_reason")) == (
        steps[-1],
        "length",
        "None",
    )


@pytest.mark.parametrize("key", ["llmapi_current", "llmapi_v12"])
def test_a_stream_is_cumulative_text_with_none_reasons_until_the_end_or_one_response_on_1_2(
    key: str, triton_stack: TritonStack
) -> None:
    (whole,) = stream_infer(triton_stack.grpc_url, f"{key}_whole", _greedy(8))
    responses = stream_infer(triton_stack.grpc_url, key, _greedy(8, streaming=np.array([True])))
    final = responses[-1]
    assert final.final and final.error is None
    assert _out(final, "text_output") == _out(whole, "text_output")
    assert (_out(final, "finish_reason"), _out(final, "stop_reason")) == ("length", "None")
    if key == "llmapi_v12":
        # TensorRT-LLM 1.2.x's model.py answers a stream once, with the whole text.
        assert len(responses) == 1
        return
    # One response a step, each the whole text so far; the final one repeats it.
    texts = [_out(r, "text_output") for r in responses[:-1]]
    assert len(texts) == 8 and all(_extends(a, b) for a, b in itertools.pairwise(texts))
    assert texts[-1] == _out(final, "text_output")
    for r in responses[:-1]:
        assert not r.final
        assert (_out(r, "finish_reason"), _out(r, "stop_reason")) == ("None", "None")


def test_closing_the_stream_cancels_the_request_in_the_model(triton_stack: TritonStack) -> None:
    key = "llmapi_current"
    inputs = _greedy(400, streaming=np.array([True]))
    # A request that finished before the stream was closed shows nothing: try again.
    for _ in range(3):
        cancelled = triton_stack.metric("llmapi_stand_in_cancelled_requests_total", model=key)
        completed = triton_stack.metric("llmapi_stand_in_completed_requests_total", model=key)
        responses = stream_infer(triton_stack.grpc_url, key, inputs, on_response=lambda r, c: True)
        assert len(responses) == 1 and not responses[0].final
        closed = time.monotonic()
        # Polled every 100 ms by the model; ten seconds for a loaded machine.
        while time.monotonic() - closed < 10:
            if triton_stack.metric("llmapi_stand_in_cancelled_requests_total", model=key) > cancelled:
                assert triton_stack.metric("llmapi_stand_in_active_requests", model=key) == 0
                return
            if triton_stack.metric("llmapi_stand_in_completed_requests_total", model=key) > completed:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the model never saw its stream closed")
    pytest.fail("every request finished before its stream was closed")


def test_a_model_error_is_internal_with_the_models_prefix(triton_stack: TritonStack) -> None:
    # 1.2.x's model.py answers every error (the current one drops some: below). A stream's error
    # carries its message only; a unary call to a model that is not decoupled shows the status too.
    inputs = {**_greedy(8), "text_input": _strings(b"hello " * 2000)}
    client = grpcclient.InferenceServerClient(triton_stack.grpc_url)
    with client, pytest.raises(InferenceServerException) as raised:
        client.infer("llmapi_v12_whole", [_infer_input(n, v) for n, v in inputs.items()])
    assert raised.value.status() == "StatusCode.INTERNAL"
    assert str(raised.value.message()).startswith("Error generating request: The sum of prompt length")


def _log_count(stack: TritonStack, needle: str) -> int:
    return stack.server.log_file.read_text(errors="replace").count(needle)


@pytest.mark.parametrize(
    ("model", "extra", "logged"),
    [
        ("llmapi_current_whole", {"streaming": np.array([True])}, "Streaming is only supported in decoupled"),
        (
            "llmapi_current",
            {"sampling_param_best_of": np.array([2], dtype=np.int32)},
            "does not allow best_of (2) > 1",
        ),
        (
            "llmapi_current",
            {
                "lora_id": np.array([4242], dtype=np.uint64),
                "lora_name": _strings(b"absent"),
                "lora_path": _strings(b"/nonexistent/llmapi-contract-adapter"),
            },
            "/nonexistent/llmapi-contract-adapter",
        ),
        ("llmapi_current", {"text_input": _strings(b"hello " * 2000)}, "The sum of prompt length"),
    ],
    ids=["streaming-not-decoupled", "best_of-greedy", "bad-lora", "too-long"],
)
def test_the_current_model_never_answers_errors_raised_before_it_registers_the_request(
    model: str, extra: dict[str, np.ndarray], logged: str, triton_stack: TritonStack
) -> None:
    before = _log_count(triton_stack, logged)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_stack.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        inputs = {**_greedy(8), **extra}
        client.async_stream_infer(
            model, [_infer_input(n, v) for n, v in inputs.items()], enable_empty_final_response=True
        )
        # The model handles its requests in order: once a later one is answered, the first was
        # handled. It is logged in Triton, and nothing came back for it.
        (later,) = stream_infer(triton_stack.grpc_url, model, _greedy(2))
        assert later.error is None and later.final
        deadline = time.monotonic() + 30
        while _log_count(triton_stack, logged) == before:
            assert time.monotonic() < deadline, "the error was never logged"
            time.sleep(0.05)
        with pytest.raises(queue.Empty):
            answers.get(timeout=0.5)
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()


# ---- the gateway over what the current model.py never answers -------------------------------------


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_numpy_adapter(tmp_path_factory.mktemp("llmapi-contract") / "adapter")


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack, adapter: Path) -> Iterator[GatewayProcess]:
    m = triton_stack.llmapi["llmapi_current"]
    args = [
        "--triton-url",
        triton_stack.grpc_url,
        "--log-level",
        "warning",
        "--triton-stream-idle-timeout-s",
        str(IDLE_S),
        "--model",
        f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.name}",
        "--model",
        f"name=tiny-whole,tokenizer={m.tokenizer_dir},triton_model=llmapi_current_whole",
        # Readable here, but not where the Triton server looks: the model cannot load it and,
        # the current model.py, answers nothing.
        "--lora",
        f"lost={adapter},base=tiny,server_path=/nonexistent/llmapi-contract-lost",
        # Not an adapter at all: the gateway refuses it itself.
        "--lora",
        f"broken={adapter.parent},base=tiny,server_path={adapter.parent}",
    ]
    with GatewayProcess(args) as process:
        yield process


def _post(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return http_client.post(gateway.base_url + path, json=body, timeout=120)


def test_the_gateway_refuses_itself_what_the_model_would_not_answer(gateway: GatewayProcess) -> None:
    messages = [{"role": "user", "content": "hello " * 2000}]
    r = _post(gateway, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    r = _post(gateway, "/v1/messages", {"model": "tiny", "messages": messages, "max_tokens": 4})
    assert_error(r, 400, "invalid_request_error", message="maximum context length")
    r = _post(gateway, "/v1/completions", {"model": "tiny", "prompt": "hi", "best_of": 2, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of", r.text
    r = _post(
        gateway, "/v1/chat/completions", {"model": "broken", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_adapter_invalid", r.text
    # A stream asked of a model that is not decoupled is sent as one request and streamed from it.
    user = [{"role": "user", "content": "Hello"}]
    whole = _post(
        gateway,
        "/v1/chat/completions",
        {"model": "tiny-whole", "messages": user, "max_tokens": 6, "temperature": 0},
    ).json()
    with http_client.stream(
        "POST",
        gateway.base_url + "/v1/chat/completions",
        json={"model": "tiny-whole", "messages": user, "max_tokens": 6, "temperature": 0, "stream": True},
        timeout=120,
    ) as streamed:
        lines = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"] and text


def test_a_request_the_model_never_answers_ends_in_a_timeout_and_nothing_else_is_lost(
    gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    user = [{"role": "user", "content": "Hello"}]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        started = time.monotonic()
        lost_chat = pool.submit(
            _post, gateway, "/v1/chat/completions", {"model": "lost", "messages": user, "max_tokens": 4}
        )
        lost_messages = pool.submit(
            _post, gateway, "/v1/messages", {"model": "lost", "messages": user, "max_tokens": 4}
        )
        # Beside them, requests the model answers are served whole, streamed and not.
        served = [
            pool.submit(
                _post,
                gateway,
                "/v1/completions",
                {"model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": stream},
            )
            for stream in (False, True)
        ]
        chat, message = lost_chat.result(), lost_messages.result()
        elapsed = time.monotonic() - started
        answers = [f.result() for f in served]
    assert chat.status_code == 504, chat.text
    assert chat.json()["error"]["code"] == "timeout" and "sent nothing" in chat.json()["error"]["message"]
    assert_error(message, 504, "timeout_error", message="sent nothing")
    assert elapsed >= IDLE_S
    expected = stand_in_completion(triton_stack)
    whole, streamed = answers
    assert whole.status_code == 200 and whole.json()["choices"][0]["text"] == expected
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected


def stand_in_completion(stack: TritonStack) -> str:
    (whole,) = stream_infer(stack.grpc_url, "llmapi_current_whole", _greedy(8))
    return _out(whole, "text_output")
