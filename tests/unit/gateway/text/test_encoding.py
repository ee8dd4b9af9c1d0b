"""The piecewise prompt encoder on the real tokenizers: its ids are the tokenizer's own for any text
and any growth of a text (byte-level BPE: Qwen3, Llama 3.1; SentencePiece: Llama 2, Gemma 3), and a
long encode leaves the event loop free."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.families import tokenizer_dir
from gateway.asyncutil import watch_loop_lag
from gateway.text.encoding import PieceCache, PromptEncoder

FAMILIES = ("qwen3", "llama3_1", "llama2", "gemma3")


def _backend(family: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(tokenizer_dir(family)) / "tokenizer.json"))


@pytest.fixture(scope="module", params=FAMILIES)
def encoder(request: pytest.FixtureRequest) -> tuple[Any, PromptEncoder]:
    backend = _backend(request.param)
    enc = PromptEncoder(backend, inline_chars=0, cache_bytes=64 << 20, threads=1)
    yield backend, enc
    enc.close()


def test_every_family_is_encoded_incrementally_and_cuts_only_at_raw_added_tokens(encoder) -> None:
    backend, enc = encoder
    assert enc.incremental, "the start-up check found pieces that do not join to the full encoding"
    added = backend.get_added_tokens_decoder().values()
    cut = set(enc._split_ids)
    # Every cut is an added token matched on raw text with no stripping: nothing merges across it.
    assert cut and all(
        not (t.normalized or t.lstrip or t.rstrip or t.single_word) for t in added if t.content in cut
    )


# Fragments chosen to merge with their neighbours when not cut: letters and spaces on both sides of
# an added token, partial added-token text, SentencePiece's "▁", byte-fallback characters, digits
# that BPE groups, CRLF and whitespace runs.
_FRAGMENTS = st.sampled_from(
    [
        "a",
        "b",
        " ",
        "  ",
        "\n",
        "\r\n",
        "\t",
        "hello",
        " world",
        "▁",
        "é",
        "数字",
        "🙂",
        "123",
        "4567",
        "<",
        "|>",
        "<|",
        "im_",
        "'s",
        "don't",
        ".",
        '{"k": 1}',
        "```",
        "\u0301",
    ]
)


def _texts(specials: list[str]) -> st.SearchStrategy[str]:
    piece = st.one_of(_FRAGMENTS, st.sampled_from(specials), st.text(max_size=6))
    return st.lists(piece, max_size=24).map("".join)


def _specials(backend: Any, enc: PromptEncoder) -> list[str]:
    # The template's own markers first (where they are), then a spread of the rest.
    cut = sorted(enc._split_ids)
    return cut[:: max(1, len(cut) // 40)] + [t for t in cut if "start" in t or "end" in t][:8]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pieces_join_to_the_full_encoding(encoder, data) -> None:
    backend, enc = encoder
    text = data.draw(_texts(_specials(backend, enc)))
    for special in (False, True):
        want = backend.encode(text, add_special_tokens=special).ids
        assert enc.encode_now(text, add_special_tokens=special) == want, (text, special)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_growing_text_reuses_its_pieces_and_still_equals_a_full_encode(encoder, data) -> None:
    backend, enc = encoder
    texts = _texts(_specials(backend, enc))
    text = data.draw(texts)
    # Each turn extends the text; an extension that continues the last piece (no added token
    # between) must re-encode that piece, not reuse its old ids.
    for _ in range(3):
        text += data.draw(texts)
        assert (
            enc.encode_now(text, add_special_tokens=False)
            == backend.encode(text, add_special_tokens=False).ids
        )


def test_a_turn_on_a_long_conversation_encodes_only_its_new_pieces(encoder) -> None:
    backend, enc = encoder
    start, end = _turn_markers(enc)
    body = " ".join(f"word{i % 97} value {i}" for i in range(3000))
    conversation = f"{start}system\n{body}{end}\n"
    enc.encode_now(conversation, add_special_tokens=False)
    misses = enc.cache.misses
    turn = f"{start}user\nand one more question{end}\n{start}assistant\n"
    got = enc.encode_now(conversation + turn, add_special_tokens=False)
    assert got == backend.encode(conversation + turn, add_special_tokens=False).ids
    new_pieces = {p.text for p in enc.pieces(turn) if p.token_id is None}
    assert enc.cache.misses - misses <= len(new_pieces)


def _turn_markers(enc: PromptEncoder) -> tuple[str, str]:
    for start, end in (
        ("<|im_start|>", "<|im_end|>"),
        ("<|start_header_id|>", "<|eot_id|>"),
        ("<start_of_turn>", "<end_of_turn>"),
        ("<s>", "</s>"),
    ):
        if start in enc._split_ids and end in enc._split_ids:
            return start, end
    raise AssertionError("no turn markers among the added tokens")


def test_the_piece_cache_is_bounded_by_bytes_least_recently_used_out() -> None:
    cache = PieceCache(max_bytes=3 * PieceCache.cost((False, "x" * 10), tuple(range(10))))
    for i in range(3):
        cache.put((False, f"{i}" * 10), tuple(range(10)))
    assert cache.get((False, "0" * 10)) is not None  # 0 is now the most recently used
    cache.put((False, "3" * 10), tuple(range(10)))
    assert cache.get((False, "1" * 10)) is None and cache.get((False, "0" * 10)) is not None
    assert cache.bytes <= cache.max_bytes and len(cache) == 3


async def test_a_long_encode_leaves_the_event_loop_free() -> None:
    """While a long prompt is encoded the loop keeps running its timers: its worst lag stays far
    below what encoding inline costs (a blocked loop would lag by all of it). The bound is
    relative, so a loaded machine slows both sides alike."""
    backend = _backend("qwen3")
    enc = PromptEncoder(backend)
    words = " ".join(f"tok{i % 113} {i % 7}" for i in range(25000))
    text = f"<|im_start|>system\n{words}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    t0 = time.perf_counter()
    want = backend.encode(text, add_special_tokens=False).ids
    inline_s = time.perf_counter() - t0
    lags: list[float] = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)  # as the gateway's app sets it
    watcher = asyncio.create_task(watch_loop_lag(lags.append, interval_s=0.002))
    try:
        await asyncio.sleep(0.01)
        got = await enc.encode(text + " ", add_special_tokens=False)  # (not cached: a new last piece)
        await asyncio.sleep(0.01)
    finally:
        watcher.cancel()
        sys.setswitchinterval(old)
        enc.close()
    assert got == backend.encode(text + " ", add_special_tokens=False).ids and want
    assert lags, "the watcher never ran"
    assert max(lags) < inline_s / 3, (max(lags), inline_s)
