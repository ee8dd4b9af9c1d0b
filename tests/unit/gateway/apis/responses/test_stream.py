"""The Responses stream builder: exact event sequences, sequence numbers, frames equal to the
dumped events, every event and the final response valid against OpenAI's published schemas."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.apis.responses.protocol import Response
from gateway.apis.responses.stream import ResponseBuilder, frame
from tests.support.openai_schema import validate

USAGE = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 8,
}

EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.reasoning_text.delta": "ResponseReasoningTextDeltaEvent",
    "response.reasoning_text.done": "ResponseReasoningTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.failed": "ResponseFailedEvent",
}


def start_response(**fields: Any) -> dict[str, Any]:
    base = Response(id="resp_1", created_at=1700000000, status="in_progress", model="tiny", **fields)
    return base.model_dump(mode="json")


def events(data: bytes) -> list[dict[str, Any]]:
    out = []
    for raw in data.split(b"\n\n"):
        if not raw:
            continue
        head, body = raw.split(b"\n", 1)
        assert head.startswith(b"event: ") and body.startswith(b"data: ")
        event = json.loads(body[len(b"data: ") :])
        assert head[len(b"event: ") :].decode() == event["type"]
        # Every frame is exactly the dumped event (the delta frames are assembled by hand).
        assert raw + b"\n\n" == frame(event)
        validate(EVENT_SCHEMAS[event["type"]], event)
        validate("ResponseStreamEvent", event)
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def types(evs: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in evs]


def test_text_response_streams_the_documented_sequence() -> None:
    builder = ResponseBuilder(start_response(), streaming=True)
    data = (
        builder.start() + builder.text("Hel") + builder.text("") + builder.text("lo") + builder.finish(USAGE)
    )
    evs = events(data)
    assert types(evs) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["delta"] for e in evs if e["type"] == "response.output_text.delta"] == ["Hel", "lo"]
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
    final = evs[-1]["response"]
    validate("Response", final)
    assert final["status"] == "completed" and final["completed_at"] is not None
    assert final["output"][0]["content"][0]["text"] == "Hello"
    assert final["output"][0]["status"] == "completed"
    assert final["usage"] == USAGE
    assert final == builder.response


def test_whole_response_equals_the_streamed_one() -> None:
    def run(streaming: bool) -> dict[str, Any]:
        b = ResponseBuilder(start_response(), streaming=streaming)
        b.start()
        b.reasoning("think")
        b.text("a")
        b.function_call("call_1", "f")
        b.arguments('{"x"')
        b.arguments(": 1}")
        b.finish(USAGE)
        return b.response

    streamed, whole = run(True), run(False)
    for r in (streamed, whole):
        for item in r["output"]:
            item.pop("id")
        r.pop("completed_at")
    assert streamed == whole
    assert ResponseBuilder(start_response(), streaming=False).start() == b""


def test_reasoning_then_text_then_two_calls() -> None:
    sealed: list[str] = []

    def seal(text: str) -> str:
        sealed.append(text)
        return "sealed:" + text

    builder = ResponseBuilder(start_response(), streaming=True, seal=seal)
    data = (
        builder.start()
        + builder.reasoning("Let me ")
        + builder.reasoning("think.")
        + builder.text("Calling.")
        + builder.function_call("call_a", "get_weather")
        + builder.arguments('{"city": ')
        + builder.arguments('"Paris"}')
        + builder.function_call("call_b", "read", namespace="fs")
        + builder.arguments("{}")
        + builder.finish(USAGE)
    )
    evs = events(data)
    assert types(evs) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["output_index"] for e in evs if e["type"] == "response.output_item.added"] == [0, 1, 2, 3]
    reasoning, message, call_a, call_b = evs[-1]["response"]["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "Let me think."}
    ]
    assert reasoning["encrypted_content"] == "sealed:Let me think." and sealed == ["Let me think."]
    assert message["content"][0]["text"] == "Calling."
    assert (call_a["call_id"], call_a["name"], call_a["arguments"]) == (
        "call_a",
        "get_weather",
        '{"city": "Paris"}',
    )
    assert (call_b["namespace"], call_b["arguments"]) == ("fs", "{}")
    done = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert [(d["name"], d["arguments"]) for d in done] == [
        ("get_weather", '{"city": "Paris"}'),
        ("read", "{}"),
    ]
    # Every delta names the item it belongs to.
    ids = {e["output_index"]: e["item"]["id"] for e in evs if e["type"] == "response.output_item.added"}
    for e in evs:
        if e["type"].endswith(".delta"):
            assert e["item_id"] == ids[e["output_index"]]
    validate("Response", evs[-1]["response"])


def test_cut_by_the_token_limit_is_incomplete() -> None:
    builder = ResponseBuilder(start_response(max_output_tokens=16), streaming=True)
    data = builder.start() + builder.function_call("call_1", "f") + builder.arguments('{"na')
    data += builder.finish(USAGE, incomplete="max_output_tokens")
    evs = events(data)
    assert types(evs)[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = evs[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    assert final["output"][0]["arguments"] == '{"na'
    assert final["completed_at"] is None
    validate("Response", final)


def test_failure_mid_stream_ends_with_response_failed() -> None:
    builder = ResponseBuilder(start_response(), streaming=True)
    data = builder.start() + builder.text("partial") + builder.fail("server_error", "Triton failed")
    evs = events(data)
    assert types(evs)[-1] == "response.failed"
    failed = evs[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "Triton failed"}
    validate("Response", failed)


def test_logprobs_ride_on_the_deltas_and_the_final_part() -> None:
    lp = [
        {
            "token": "a",
            "logprob": -0.5,
            "bytes": [97],
            "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}],
        }
    ]
    builder = ResponseBuilder(start_response(top_logprobs=1), streaming=True)
    evs = events(builder.start() + builder.text("a", lp) + builder.finish(USAGE))
    delta = next(e for e in evs if e["type"] == "response.output_text.delta")
    assert delta["logprobs"] == lp
    assert evs[-1]["response"]["output"][0]["content"][0]["logprobs"] == lp


@pytest.mark.parametrize("text", ["plain", 'quote " and \\ backslash', "ünï 🙂\n\t", "\x00\u2028"])
def test_delta_frames_equal_the_dumped_events(text: str) -> None:
    # events() checks each frame byte for byte against dumping its parsed event.
    builder = ResponseBuilder(start_response(), streaming=True)
    data = builder.start() + builder.reasoning(text) + builder.text(text) + builder.function_call("c", "f")
    evs = events(data + builder.arguments(text) + builder.finish(USAGE))
    deltas = [e["delta"] for e in evs if e["type"].endswith(".delta")]
    assert deltas == [text, text, text]
