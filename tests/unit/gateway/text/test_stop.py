from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text.stop import StopStringMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    m = StopStringMatcher(stops)
    out = "".join(m.push(p) for p in pieces)
    out += m.flush()
    return out, m.stopped


@pytest.mark.parametrize(
    ("stops", "pieces", "expected", "stopped"),
    [
        (["END"], ["abc", "EN", "D tail"], "abc", True),
        (["END"], ["abcE", "N"], "abcEN", False),
        (["\n\n"], ["line one\n", "\nline two"], "line one", True),
        (["xyz", "yz"], ["wxy", "z"], "w", True),
        (["stop"], ["no match here"], "no match here", False),
        (["a"], ["a"], "", True),
        ([], ["anything"], "anything", False),
        (["你好"], ["说", "你", "好吗"], "说", True),
    ],
)
def test_stop_string_split_across_chunks_is_removed(
    stops: list[str], pieces: list[str], expected: str, stopped: bool
) -> None:
    assert run(stops, pieces) == (expected, stopped)


def test_nothing_is_emitted_after_a_stop() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.push("aSTOPb") == "a"
    assert m.push("more") == ""
    assert m.flush() == ""


def test_text_that_could_start_a_stop_is_held_back() -> None:
    m = StopStringMatcher(["</s>"])
    assert m.push("hello </") == "hello "
    assert m.push("x") == "</x"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab c\n你", max_size=40),
    stops=st.lists(st.text(alphabet="ab c\n你", min_size=1, max_size=4), max_size=3),
    data=st.data(),
)
def test_any_split_cuts_where_the_first_stop_string_completes(
    text: str, stops: list[str], data: st.DataObject
) -> None:
    """Generation stops as soon as a stop string has appeared; of the stop strings completed by the
    same character, the longest (earliest-starting) one is cut."""
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 1))))
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    ends = {s: text.find(s) + len(s) for s in stops if s in text}
    if ends:
        first_end = min(ends.values())
        expected = text[: first_end - max(len(s) for s, e in ends.items() if e == first_end)]
    else:
        expected = text
    assert run(stops, pieces) == (expected, bool(ends))


@pytest.mark.parametrize(
    ("stops", "pieces", "matched"),
    [
        (["END", "STOP"], ["abc ST", "OP END"], "STOP"),
        (["b", "ab"], ["xa", "b"], "ab"),
        (["END"], ["no stop here"], None),
    ],
)
def test_the_stop_string_that_matched_is_named(
    stops: list[str], pieces: list[str], matched: str | None
) -> None:
    m = StopStringMatcher(stops)
    for piece in pieces:
        m.push(piece)
    assert m.matched == matched
