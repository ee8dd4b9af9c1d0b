"""Cumulative text to deltas: any way the same text grows gives the same deltas joined; a text
that does not extend what was sent is an error; a trailing U+FFFD waits for the next response."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.text.cumulative import CumulativeText, NotCumulativeError


def feed(texts: list[str]) -> str:
    adapter = CumulativeText()
    out = b"".join(adapter.push(t.encode()) for t in texts) + adapter.finish()
    return out.decode()


@given(st.text(), st.lists(st.integers(min_value=0, max_value=200)))
def test_any_growth_of_the_same_text_gives_that_text(text: str, cuts: list[int]) -> None:
    steps = [*sorted(min(c, len(text)) for c in cuts), len(text)]
    assert feed([text[:n] for n in steps]) == text


def test_a_server_that_answers_a_stream_in_one_piece_is_one_delta() -> None:
    adapter = CumulativeText()
    assert adapter.push(b"the whole answer") == b"the whole answer"
    assert adapter.finish() == b""


def test_repeated_text_gives_empty_deltas() -> None:
    adapter = CumulativeText()
    assert adapter.push(b"ab") == b"ab"
    assert adapter.push(b"ab") == b""
    assert adapter.push(b"abc") == b"c"


def test_a_text_that_changes_what_was_sent_is_an_error() -> None:
    adapter = CumulativeText()
    adapter.push(b"hello")
    with pytest.raises(NotCumulativeError):
        adapter.push(b"help!")


def test_a_trailing_replacement_character_waits_for_the_rest_of_the_character() -> None:
    adapter = CumulativeText()
    # A detokenizer holding half of "é" shows U+FFFD, then the character itself.
    assert adapter.push("caf\ufffd".encode()) == b"caf"
    assert adapter.push("café".encode()) == "é".encode()
    # One that stays is the model's own text, released at the end.
    assert adapter.push("café \ufffd\ufffd".encode()) == b" "
    assert adapter.finish() == "\ufffd\ufffd".encode()
    assert adapter.text == "café \ufffd\ufffd".encode()
