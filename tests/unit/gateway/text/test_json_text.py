from __future__ import annotations

import json
from typing import Any

import jiter
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.text.tool_calls.json_text import (
    DONE,
    INVALID,
    SCANNING,
    JsonScanner,
    compact_object,
    load_json,
    object_members,
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)
OBJECTS = st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=4)


@settings(max_examples=300, deadline=None)
@given(value=OBJECTS, indent=st.sampled_from([None, 0, 2, "\t"]), ascii_only=st.booleans())
def test_an_object_comes_back_without_whitespace_between_its_tokens(
    value: dict[str, Any], indent: int | str | None, ascii_only: bool
) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert compact_object(" \n" + text + "\n") == json.dumps(
        value, ensure_ascii=ascii_only, separators=(",", ":")
    )


@settings(max_examples=300, deadline=None)
@given(value=OBJECTS, data=st.data())
def test_every_prefix_of_an_object_is_scanned_and_what_came_back_parses_as_partial_json(
    value: dict[str, Any], data: st.DataObject
) -> None:
    text = json.dumps(value, indent=1)
    scanner = JsonScanner(object_only=True)
    out = ""
    i = 0
    while i < len(text):
        j = data.draw(st.integers(i + 1, len(text)))
        out += scanner.feed(text[i:j])
        assert scanner.consumed == j - i
        assert scanner.state == (DONE if j == len(text) else SCANNING)
        # What a streaming client has so far is always JSON as far as it goes.
        jiter.from_json(out.encode(), partial_mode=True)
        i = j
    assert json.loads(out) == value


# Characters JSON is made of, and a few that it is not.
JSONISH = st.text(alphabet='{}[]",:0123456789.-+eEtrufalsn\\/ \n\tux\x01', max_size=24)


@settings(max_examples=2000, deadline=None)
@given(text=JSONISH | OBJECTS.map(json.dumps))
def test_the_scanner_accepts_exactly_what_json_loads_accepts(text: str) -> None:
    value = load_json(text)
    compact = compact_object(text)
    if isinstance(value, dict):
        assert compact is not None and json.loads(compact) == value
    else:
        assert compact is None


@settings(max_examples=1000, deadline=None)
@given(text=JSONISH)
def test_text_that_stops_being_json_is_cut_where_it_stops(text: str) -> None:
    scanner = JsonScanner(object_only=True)
    out = scanner.feed(text)
    if scanner.state == INVALID:
        # Everything before the offending character was a valid prefix, and came back.
        if out:
            jiter.from_json(out.encode(), partial_mode=True)
        assert compact_object(text) is None


@pytest.mark.parametrize(
    ("text", "state", "out"),
    [
        ('{"a": 01}', INVALID, '{"a":0'),
        ('{"a": 1.}', INVALID, '{"a":1.'),
        ('{"a": -}', INVALID, '{"a":-'),
        ('{"a": "\x01"}', INVALID, '{"a":"'),
        ('{"a": "\\q"}', INVALID, '{"a":"\\'),
        ('{"a": "\\u12g4"}', INVALID, '{"a":"\\u12'),
        ('{"a": tru}', INVALID, '{"a":tru'),
        ('{"a": 1,}', INVALID, '{"a":1,'),
        ('{"a": NaN}', INVALID, '{"a":'),
        ('{"a" 1}', INVALID, '{"a"'),
        ("[1]", INVALID, ""),
        (
            '{"a": [1, 2.5e-3, true, null, "\\u00e9\\n"], "b": {}} tail',
            DONE,
            '{"a":[1,2.5e-3,true,null,"\\u00e9\\n"],"b":{}}',
        ),
    ],
)
def test_the_scanner_stops_at_the_first_character_that_cannot_continue(
    text: str, state: int, out: str
) -> None:
    scanner = JsonScanner(object_only=True)
    assert scanner.feed(text) == out
    assert scanner.state == state


def test_object_members_are_compact_and_the_last_repeated_key_wins() -> None:
    assert object_members('{"name": "f", "arguments": {"x": [1, 2]}, "n": -1.5, "name": "g"}') == {
        "name": '"g"',
        "arguments": '{"x":[1,2]}',
        "n": "-1.5",
    }
    assert object_members("{ }") == {}
    assert object_members("[1]") is None
