"""The per-token chunk writers: their pre-dumped head plus per-token values are byte for byte the
dumped chunk dict, for any text, index, reason and log probabilities."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.apis.chat_completions.stream import ChatChunkWriter
from gateway.apis.completions.stream import CompletionChunkWriter

names = st.text(max_size=20)
logprobs = st.none() | st.fixed_dictionaries(
    {
        "tokens": st.lists(st.text(max_size=5), max_size=3),
        "token_logprobs": st.lists(st.floats(-50, 0), max_size=3),
    }
)


# What every chunk of a response shares, and one choice's index, text and log probabilities.
CHUNK = {
    "rid": names,
    "model": names,
    "created": st.integers(0, 2**40),
    "index": st.integers(0, 10_000),
    "text": st.text(),
    "lp": logprobs,
}


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@given(**CHUNK, reason=st.sampled_from([None, "stop", "length"]), usage=st.booleans())
def test_a_completion_text_chunk_is_the_dumped_chunk_dict(
    rid: str,
    model: str,
    created: int,
    index: int,
    text: str,
    reason: str | None,
    lp: dict[str, Any] | None,
    usage: bool,
) -> None:
    chunk = CompletionChunkWriter(rid, created, model, include_usage=usage).text(index, text, reason, lp)
    base = {"id": rid, "object": "text_completion", "created": created, "model": model}
    choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": reason}
    body: dict[str, Any] = {**base, "choices": [choice]}
    if usage:
        body["usage"] = None  # as chat chunks, and as OpenAI streams completions
    assert chunk == frame(body)
    assert orjson.loads(chunk[len(b"data: ") :])["choices"][0]["text"] == text


@given(**CHUNK, usage=st.booleans())
def test_a_chat_content_chunk_is_the_dumped_chunk_dict(
    rid: str, model: str, created: int, index: int, text: str, lp: dict[str, Any] | None, usage: bool
) -> None:
    chunk = ChatChunkWriter(rid, created, model, include_usage=usage).content(index, text, lp)
    body: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": index, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}],
    }
    if usage:
        body["usage"] = None
    assert chunk == frame(body)
