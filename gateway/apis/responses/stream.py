"""The Responses API's output as a pure state machine: text, reasoning and function-call pieces
in, output items and (when streaming) the documented SSE events out, each with its
`sequence_number`:

    response.created, response.in_progress,
    per item: response.output_item.added,
      message:   response.content_part.added,
                 response.output_text.delta ... .done, response.content_part.done
      reasoning: response.content_part.added,
                 response.reasoning_text.delta ... .done, response.content_part.done
      function_call: response.function_call_arguments.delta ... .done
    response.output_item.done,
    and last response.completed, response.incomplete or response.failed.

One builder makes both the streamed events and the whole response, so the two cannot differ.
Frames are `event: <type>` and `data: <json>` lines; the per-token delta frame is assembled from a
pre-dumped head (byte for byte what dumping the event gives; tested)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def frame(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


_TEXT_DELTA = "response.output_text.delta"
_REASONING_DELTA = "response.reasoning_text.delta"
_ARGUMENTS_DELTA = "response.function_call_arguments.delta"


class _Item:
    __slots__ = ("head", "index", "item", "kind", "logprobs", "parts")

    def __init__(self, kind: str, index: int, item: dict[str, Any]) -> None:
        self.kind = kind
        self.index = index
        self.item = item
        self.parts: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.head = b""


class ResponseBuilder:
    """Builds one response. `streaming=False` skips the frames (every method then returns b"")."""

    __slots__ = ("_item", "_response", "_seal", "_seq", "_streaming", "output")

    def __init__(
        self,
        response: dict[str, Any],
        *,
        streaming: bool,
        seal: Callable[[str], str] | None = None,
    ) -> None:
        # The response object as it starts: every request field echoed, status "in_progress".
        self._response = response
        self._streaming = streaming
        # Seals a finished reasoning text into `encrypted_content`; None when not asked for.
        self._seal = seal
        self._seq = 0
        self._item: _Item | None = None
        self.output: list[dict[str, Any]] = []

    # ------------------------------------------------------------ frames

    def _event(self, event: dict[str, Any]) -> bytes:
        if not self._streaming:
            return b""
        event["sequence_number"] = self._seq
        self._seq += 1
        return frame(event)

    def _snapshot(self) -> dict[str, Any]:
        return {**self._response, "output": [dict(item) for item in self.output]}

    def start(self) -> bytes:
        return self._event({"type": "response.created", "response": self._snapshot()}) + self._event(
            {"type": "response.in_progress", "response": self._snapshot()}
        )

    # ------------------------------------------------------------ items

    def _open(self, kind: str, item: dict[str, Any], part: dict[str, Any] | None) -> bytes:
        out = self._close("completed")
        opened = _Item(kind, len(self.output), item)
        self._item = opened
        out += self._event(
            {"type": "response.output_item.added", "output_index": opened.index, "item": dict(item)}
        )
        if part is not None:
            out += self._event(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": opened.index,
                    "content_index": 0,
                    "part": part,
                }
            )
        if self._streaming:
            delta_type = {"message": _TEXT_DELTA, "reasoning": _REASONING_DELTA}.get(kind, _ARGUMENTS_DELTA)
            head: dict[str, Any] = {"type": delta_type, "item_id": item["id"], "output_index": opened.index}
            if kind != "function_call":
                head["content_index"] = 0
            opened.head = (
                b"event: " + delta_type.encode() + b"\ndata: " + orjson.dumps(head)[:-1] + b',"delta":'
            )
        return out

    def _delta(self, item: _Item, delta: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        item.parts.append(delta)
        if logprobs:
            item.logprobs.extend(logprobs)
        if not self._streaming:
            return b""
        seq = self._seq
        self._seq += 1
        # _event({**head, "delta": delta, "sequence_number": seq[, "logprobs": logprobs]})
        if item.kind == "message":
            return b'%b%b,"sequence_number":%d,"logprobs":%b}\n\n' % (
                item.head,
                orjson.dumps(delta),
                seq,
                orjson.dumps(logprobs or []),
            )
        return b'%b%b,"sequence_number":%d}\n\n' % (item.head, orjson.dumps(delta), seq)

    def _close(self, status: str) -> bytes:
        item = self._item
        if item is None:
            return b""
        self._item = None
        text = "".join(item.parts)
        data = item.item
        data["status"] = status
        out = b""
        if item.kind == "function_call":
            data["arguments"] = text
            out += self._event(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": data["id"],
                    "name": data["name"],
                    "output_index": item.index,
                    "arguments": text,
                }
            )
        else:
            if item.kind == "message":
                part: dict[str, Any] = {
                    "type": "output_text",
                    "text": text,
                    "annotations": [],
                    "logprobs": item.logprobs,
                }
                done: dict[str, Any] = {
                    "type": "response.output_text.done",
                    "text": text,
                    "logprobs": item.logprobs,
                }
            else:
                part = {"type": "reasoning_text", "text": text}
                done = {"type": "response.reasoning_text.done", "text": text}
                if self._seal is not None:
                    data["encrypted_content"] = self._seal(text)
            place = {"item_id": data["id"], "output_index": item.index, "content_index": 0}
            out += self._event({"type": done.pop("type"), **place, **done})
            out += self._event({"type": "response.content_part.done", **place, "part": part})
            data["content"] = [part]
        self.output.append(data)
        out += self._event(
            {"type": "response.output_item.done", "output_index": item.index, "item": dict(data)}
        )
        return out

    def text(self, delta: str, logprobs: list[dict[str, Any]] | None = None) -> bytes:
        """Answer text (and its tokens' log probabilities, OpenAI's LogProb objects)."""
        item = self._item
        out = b""
        if item is None or item.kind != "message":
            out = self._open(
                "message",
                {
                    "id": new_item_id("msg"),
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                },
                {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
            item = self._item
            assert item is not None
        if not delta and not logprobs:
            return out
        return out + self._delta(item, delta, logprobs)

    def reasoning(self, delta: str) -> bytes:
        item = self._item
        out = b""
        if item is None or item.kind != "reasoning":
            out = self._open(
                "reasoning",
                {"id": new_item_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"},
                {"type": "reasoning_text", "text": ""},
            )
            item = self._item
            assert item is not None
        return out + (self._delta(item, delta, None) if delta else b"")

    def function_call(self, call_id: str, name: str, namespace: str | None = None) -> bytes:
        """A new call; its arguments follow through `arguments`."""
        item: dict[str, Any] = {
            "id": new_item_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        if namespace is not None:
            item["namespace"] = namespace
        return self._open("function_call", item, None)

    def arguments(self, delta: str) -> bytes:
        item = self._item
        assert item is not None and item.kind == "function_call", "arguments belong to an open function call"
        return self._delta(item, delta, None) if delta else b""

    # ------------------------------------------------------------ the end

    def finish(self, usage: dict[str, Any], *, incomplete: str | None = None) -> bytes:
        """The last events: the open item closed (incomplete when the response is), then
        response.completed, or response.incomplete with `incomplete` as the reason."""
        out = self._close("incomplete" if incomplete else "completed")
        response = self._response
        response["usage"] = usage
        if incomplete is None:
            response["status"] = "completed"
            response["completed_at"] = int(time.time())
        else:
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": incomplete}
        kind = "response.completed" if incomplete is None else "response.incomplete"
        return out + self._event({"type": kind, "response": self._snapshot()})

    def fail(self, code: str, message: str) -> bytes:
        """A failure after the response started: response.failed with what was finished so far."""
        self._item = None
        response = self._response
        response["status"] = "failed"
        response["error"] = {"code": code, "message": message}
        return self._event({"type": "response.failed", "response": self._snapshot()})

    @property
    def response(self) -> dict[str, Any]:
        return self._snapshot()
