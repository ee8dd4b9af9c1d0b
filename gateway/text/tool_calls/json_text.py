"""JSON text as tool-call parsers need it: incremental, character by character, so that a call's
arguments can go out as the model writes them. `JsonScanner` checks a value against JSON's grammar
and hands back its text with the whitespace between tokens removed; `Span` only balances brackets
(to find where a region of text that is not valid JSON ends)."""

from __future__ import annotations

import json
import re
from typing import Any, Final


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity, which would not survive the round trip to a client.
    raise ValueError(f"{name} is not JSON")


def load_json(text: str) -> Any:
    """The parsed value, or `INVALID_JSON` (a sentinel, since null is a value)."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return INVALID_JSON


INVALID_JSON: Final = object()

JSON_WHITESPACE: Final = " \t\n\r"


def skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


def skip_json_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in JSON_WHITESPACE:
        i += 1
    return i


class Span:
    """Where a JSON object or array that starts at `start` ends. Resumable, so text streamed a token
    at a time is scanned once in all rather than once per token. It only balances brackets outside
    strings; whether the text is valid is for `JsonScanner` or `json.loads` to say."""

    __slots__ = ("_depth", "_end", "_escaped", "_in_string", "_pos", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self._pos = start
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._end: int | None = None

    def end(self, text: str) -> int | None:
        if self._end is not None:
            return self._end
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        i, n = self._pos, len(text)
        while i < n:
            c = text[i]
            i += 1
            if in_string:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self._end = i
                    break
        self._pos, self._depth, self._in_string, self._escaped = i, depth, in_string, escaped
        return self._end


def string_end(text: str, i: int) -> int | None:
    """Where the JSON string token opened by the quote at `i` ends (just past its closing quote),
    or None when the text stops inside it. Only the quotes and escapes are looked at."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
        elif c == '"':
            return j + 1
        else:
            j += 1
    return None


# ---------------------------------------------------------------- the scanner

SCANNING: Final = 0
DONE: Final = 1
INVALID: Final = 2

# What the scanner expects next (outside strings, numbers and literals).
_VALUE: Final = 0  # a value (after ':' or ',' in an array, or at the start)
_VALUE_OR_CLOSE: Final = 1  # right after '['
_KEY_OR_CLOSE: Final = 2  # right after '{'
_KEY: Final = 3  # after ',' in an object
_COLON: Final = 4
_AFTER: Final = 5  # after a value: ',' or the container's closing bracket
_STRING: Final = 6
_ESCAPE: Final = 7
_HEX: Final = 8
_NUMBER: Final = 9
_LITERAL: Final = 10

# Number states, JSON's grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
_N_SIGN: Final = 0  # after '-': a digit must follow
_N_ZERO: Final = 1  # a leading 0: '.', 'e' or the end
_N_INT: Final = 2
_N_DOT: Final = 3  # after '.': a digit must follow
_N_FRAC: Final = 4
_N_EXP: Final = 5  # after 'e': a sign or a digit
_N_EXP_SIGN: Final = 6  # after the exponent's sign: a digit must follow
_N_EXP_INT: Final = 7
_N_ENDS: Final = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP_INT))

_DIGITS: Final = frozenset("0123456789")
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")
_ESCAPES: Final = frozenset('"\\/bfnrt')
_LITERALS: Final = {"t": "rue", "f": "alse", "n": "ull"}
# A run of string characters that need no decision (no quote, backslash or control character).
_PLAIN: Final = re.compile(r'[^"\\\x00-\x1f]+')


class JsonScanner:
    """One JSON value, checked against the grammar a character at a time and handed back without
    the whitespace between its tokens (so a valid value comes back compact, and what has come back
    so far is always a prefix of valid JSON). Resumable: feed it the text in any pieces.

    `state` is SCANNING until the value is complete (DONE) or a character cannot continue it
    (INVALID); `feed` then stops, and `consumed` says how much of the last piece it took (the
    character that made it INVALID is not taken). With `object_only`, the value must be an object.
    """

    __slots__ = (
        "_hex",
        "_key",
        "_literal",
        "_mode",
        "_number",
        "_object_only",
        "_stack",
        "_started",
        "consumed",
        "state",
    )

    def __init__(self, *, object_only: bool = False) -> None:
        self._object_only = object_only
        self._stack: list[str] = []  # open containers, "{" or "["
        self._mode = _VALUE
        self._key = False  # the string being read is an object key
        self._number = _N_SIGN
        self._literal = ""  # what is left of true/false/null
        self._hex = 0  # hex digits still due in a \u escape
        self._started = False
        self.state = SCANNING
        self.consumed = 0

    @property
    def depth(self) -> int:
        return len(self._stack)

    def feed(self, text: str) -> str:
        """Scans `text`; returns the part of it that belongs to the value, whitespace removed."""
        out: list[str] = []
        i, n = 0, len(text)
        stack = self._stack
        while i < n and self.state == SCANNING:
            c = text[i]
            mode = self._mode
            if mode == _STRING:
                run = _PLAIN.match(text, i)
                if run is not None:
                    out.append(run.group())
                    i = run.end()
                    continue
                if c == '"':
                    self._mode = _COLON if self._key else self._after_value()
                elif c == "\\":
                    self._mode = _ESCAPE
                else:
                    self.state = INVALID  # a raw control character
                    break
            elif mode == _ESCAPE:
                if c == "u":
                    self._mode = _HEX
                    self._hex = 4
                elif c in _ESCAPES:
                    self._mode = _STRING
                else:
                    self.state = INVALID
                    break
            elif mode == _HEX:
                if c not in _HEX_DIGITS:
                    self.state = INVALID
                    break
                self._hex -= 1
                if not self._hex:
                    self._mode = _STRING
            elif mode == _LITERAL:
                if c != self._literal[0]:
                    self.state = INVALID
                    break
                self._literal = self._literal[1:]
                if not self._literal:
                    self._mode = self._after_value()
            elif mode == _NUMBER:
                if not self._number_char(c):
                    if self._number not in _N_ENDS:
                        self.state = INVALID
                        break
                    # The number ended before this character, which is read again as what follows.
                    self._mode = self._after_value()
                    continue
            elif c in JSON_WHITESPACE:
                i += 1
                continue
            elif mode == _COLON:
                if c != ":":
                    self.state = INVALID
                    break
                self._mode = _VALUE
            elif mode == _AFTER:
                top = stack[-1]
                if c == ",":
                    self._mode = _KEY if top == "{" else _VALUE
                elif c == ("}" if top == "{" else "]"):
                    stack.pop()
                    self._mode = self._after_value()
                else:
                    self.state = INVALID
                    break
            elif c == '"' and mode in (_KEY, _KEY_OR_CLOSE):
                self._key = True
                self._mode = _STRING
            elif (mode == _KEY_OR_CLOSE and c == "}") or (mode == _VALUE_OR_CLOSE and c == "]"):
                stack.pop()
                self._mode = self._after_value()
            elif mode in (_VALUE, _VALUE_OR_CLOSE):
                if self._object_only and not self._started and c != "{":
                    self.state = INVALID
                    break
                self._started = True
                if c == "{":
                    stack.append(c)
                    self._mode = _KEY_OR_CLOSE
                elif c == "[":
                    stack.append(c)
                    self._mode = _VALUE_OR_CLOSE
                elif c == '"':
                    self._key = False
                    self._mode = _STRING
                elif c in _LITERALS:
                    self._literal = _LITERALS[c]
                    self._mode = _LITERAL
                elif c == "-" or c in _DIGITS:
                    self._number = _N_SIGN if c == "-" else _N_ZERO if c == "0" else _N_INT
                    self._mode = _NUMBER
                else:
                    self.state = INVALID
                    break
            else:
                self.state = INVALID
                break
            out.append(c)
            i += 1
        self.consumed = i
        return "".join(out)

    def _after_value(self) -> int:
        if not self._stack:
            self.state = DONE
        return _AFTER

    def _number_char(self, c: str) -> bool:
        state = self._number
        if c in _DIGITS:
            if state in (_N_SIGN, _N_INT):
                self._number = _N_ZERO if state == _N_SIGN and c == "0" else _N_INT
            elif state in (_N_DOT, _N_FRAC):
                self._number = _N_FRAC
            elif state in (_N_EXP, _N_EXP_SIGN, _N_EXP_INT):
                self._number = _N_EXP_INT
            else:
                return False  # a digit after a leading zero
            return True
        if c == "." and state in (_N_ZERO, _N_INT):
            self._number = _N_DOT
        elif c in "eE" and state in (_N_ZERO, _N_INT, _N_FRAC):
            self._number = _N_EXP
        elif c in "+-" and state == _N_EXP:
            self._number = _N_EXP_SIGN
        else:
            return False
        return True


def compact_object(text: str) -> str | None:
    """`text` without the whitespace between its tokens, if it is exactly one JSON object (with
    whitespace around it allowed); None otherwise."""
    scanner = JsonScanner(object_only=True)
    out = scanner.feed(text)
    if scanner.state != DONE or skip_json_ws(text, scanner.consumed) != len(text):
        return None
    return out


def object_members(text: str) -> dict[str, str] | None:
    """The members of the JSON object `text` (which must be valid JSON), each value as compact
    JSON text; a repeated key keeps its last value, as `json.loads` does."""
    i = skip_json_ws(text, 0)
    if not text.startswith("{", i):
        return None
    members: dict[str, str] = {}
    i = skip_json_ws(text, i + 1)
    if text.startswith("}", i):
        return members
    while True:
        end = string_end(text, i) if text.startswith('"', i) else None
        key = load_json(text[i:end]) if end is not None else INVALID_JSON
        if not isinstance(key, str) or end is None:
            return None
        i = skip_json_ws(text, end)
        if not text.startswith(":", i):
            return None
        i = skip_json_ws(text, i + 1)
        scanner = JsonScanner()
        value = scanner.feed(text[i:])
        if scanner.state != DONE:
            return None
        members[key] = value
        i = skip_json_ws(text, i + scanner.consumed)
        if text.startswith("}", i):
            return members
        if not text.startswith(",", i):
            return None
        i = skip_json_ws(text, i + 1)
