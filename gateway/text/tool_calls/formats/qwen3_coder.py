"""``qwen3_coder`` (Qwen3-Coder): calls written as XML-like tags, not JSON::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

The values are raw text; the arguments object is built from them with each value typed by the
declared tool's parameter schema, as vLLM reads them: a string (and a parameter the schema does
not name) stays text, integers and numbers are parsed (an integral number becomes an integer),
booleans are ``true``/``false``, objects and arrays are parsed as JSON; ``null`` is null whatever
the type, and a value that does not parse as its type stays text. One newline either side of a
value belongs to the layout, not the value.

A call commits when ``<function=NAME>`` is complete and NAME is a declared tool; its arguments then
stream as compact JSON: ``{`` at once, each key when its tag is complete, a text value as it is
written, a typed value when its end tag arrives, ``}`` at ``</function>``. The ``<tool_call>``
wrapper may be left out (vLLM reads a bare ``<function=`` too).
"""

from __future__ import annotations

import json
import string
from collections.abc import Collection, Mapping
from typing import Any, Final

from gateway.text.tool_calls.base import (
    REJECT,
    CallStart,
    Complete,
    Outcome,
    Piece,
    Region,
    ToolCallFormat,
    accepted,
    partial_marker_length,
)
from gateway.text.tool_calls.json_text import INVALID_JSON, load_json, skip_ws

TOOL_CALL: Final = "<tool_call>"
TOOL_CALL_END: Final = "</tool_call>"
FUNCTION: Final = "<function="
FUNCTION_END: Final = "</function>"
PARAMETER: Final = "<parameter="
PARAMETER_END: Final = "</parameter>"
# Where a value ends: its end tag, or (left out) the next parameter or the function's end.
_VALUE_ENDS: Final = (PARAMETER_END, PARAMETER, FUNCTION_END, TOOL_CALL_END)
_NAME_CHARS: Final = frozenset(string.ascii_letters + string.digits + "_-.")
_MAX_NAME: Final = 128
_NULL: Final = "null"

_OPEN: Final = 0  # after <tool_call>: a function must follow
_FUNCTION: Final = 1  # after `<function=`: the name up to `>`
_PARAMS: Final = 2  # committed: a parameter, or the function's end
_KEY: Final = 3  # after `<parameter=`: the key up to `>`
_VALUE: Final = 4
_CLOSE: Final = 5  # after `</function>`: `</tool_call>`, or another function


def _text_value(kind: str | None) -> bool:
    return kind is None or kind in ("string", "str", "text", "varchar", "char", "enum")


def typed_value(raw: str, kind: str | None) -> str:
    """The JSON text of a parameter's raw value, typed by its schema's `type` (None: not declared)."""
    if raw.lower() == _NULL:
        return "null"
    if _text_value(kind):
        return json.dumps(raw, ensure_ascii=False)
    assert kind is not None
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return str(int(raw))
        except ValueError:
            return json.dumps(raw, ensure_ascii=False)
    if kind.startswith(("num", "float")):
        try:
            number = float(raw)
        except ValueError:
            return json.dumps(raw, ensure_ascii=False)
        if number != number or number in (float("inf"), float("-inf")):
            return json.dumps(raw, ensure_ascii=False)
        return str(int(number)) if number.is_integer() else json.dumps(number)
    if kind in ("boolean", "bool", "binary"):
        return "true" if raw.lower() == "true" else "false"
    value = load_json(raw)
    if value is INVALID_JSON:
        return json.dumps(raw, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _kind(schema: Any, key: str) -> str | None:
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    spec = properties.get(key) if isinstance(properties, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    kind = spec.get("type")
    return str(kind).strip().lower() if kind is not None else "string"


class Qwen3CoderRegion:
    __slots__ = (
        "_committed",
        "_end",
        "_kind",
        "_names",
        "_parameters",
        "_pos",
        "_schema",
        "_stage",
        "_streamed",
        "_value_at",
        "_written",
        "pieces",
    )

    def __init__(self, opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> None:
        self._names = names
        self._parameters = parameters
        self._pos = len(opener)
        self._stage = _OPEN if opener == TOOL_CALL else _FUNCTION
        self._committed = False
        self._end = 0  # where the last complete call ended
        self._schema: Any = None
        self._written = 0  # parameters written in the current call
        self._kind: str | None = None  # the current value's type
        self._value_at = 0  # where the current value's text starts
        self._streamed = -1  # how much of a text value has gone out (-1: not opened yet)
        self.pieces: list[Piece] = []

    def step(self, text: str, final: bool) -> Outcome:
        while True:
            stage = self._stage
            if stage == _OPEN:
                j = skip_ws(text, self._pos)
                rest = text[j:]
                if rest.startswith(FUNCTION):
                    self._pos = j + len(FUNCTION)
                    self._stage = _FUNCTION
                    continue
                if not final and (not rest or FUNCTION.startswith(rest)):
                    return None
                return self._not_a_call()
            if stage == _FUNCTION:
                close = text.find(">", self._pos)
                name = text[self._pos : close if close != -1 else len(text)]
                if not set(name) <= _NAME_CHARS or len(name) > _MAX_NAME:
                    return self._not_a_call()
                if close == -1:
                    return self._not_a_call() if final else None
                if not accepted(name, self._names):
                    return self._not_a_call()
                self.pieces += [CallStart(name), "{"]
                self._committed = True
                self._schema = self._parameters.get(name)
                self._written = 0
                self._pos = close + 1
                self._stage = _PARAMS
                continue
            if stage == _PARAMS:
                j = skip_ws(text, self._pos)
                rest = text[j:]
                if rest.startswith(PARAMETER):
                    self._pos = j + len(PARAMETER)
                    self._stage = _KEY
                    continue
                if rest.startswith(FUNCTION_END):
                    self.pieces.append("}")
                    self._pos = self._end = j + len(FUNCTION_END)
                    self._stage = _CLOSE
                    continue
                if not final and (not rest or PARAMETER.startswith(rest) or FUNCTION_END.startswith(rest)):
                    return None
                # Cut, or something that is not a parameter: the call ends here.
                self.pieces.append("}")
                return Complete(len(text) if final and not rest.strip() else self._pos)
            if stage == _KEY:
                close = text.find(">", self._pos)
                if close == -1:
                    if final:
                        self.pieces.append("}")
                        return Complete(len(text))
                    return None
                value_at = close + 1
                if text.startswith("\n", value_at):
                    value_at += 1
                elif value_at == len(text) and not final:
                    # The layout's newline may be the next token: where the value starts is open.
                    return None
                key = text[self._pos : close]
                self.pieces.append(("," if self._written else "") + json.dumps(key, ensure_ascii=False) + ":")
                self._written += 1
                self._kind = _kind(self._schema, key)
                self._pos = value_at
                self._value_at = self._pos
                self._streamed = -1
                self._stage = _VALUE
                continue
            if stage == _VALUE:
                end, marker = -1, ""
                for candidate in _VALUE_ENDS:
                    at = text.find(candidate, self._value_at)
                    if at != -1 and (end == -1 or at < end):
                        end, marker = at, candidate
                if end == -1 and not final:
                    self._stream_value(text)
                    return None
                raw_end = end if end != -1 else len(text)
                raw = text[self._value_at : raw_end]
                if raw.endswith("\n"):
                    raw = raw[:-1]
                self._finish_value(raw)
                if marker == PARAMETER_END:
                    self._pos = end + len(PARAMETER_END)
                else:
                    self._pos = raw_end
                self._stage = _PARAMS
                if end == -1:
                    self.pieces.append("}")
                    return Complete(len(text))
                continue
            # _CLOSE
            j = skip_ws(text, self._pos)
            rest = text[j:]
            if rest.startswith(TOOL_CALL_END):
                return Complete(j + len(TOOL_CALL_END))
            if rest.startswith(FUNCTION):
                self._pos = j + len(FUNCTION)
                self._stage = _FUNCTION
                continue
            if not final and (not rest or TOOL_CALL_END.startswith(rest) or FUNCTION.startswith(rest)):
                return None
            return Complete(len(text) if final and not rest.strip() else self._end)

    def _stream_value(self, text: str) -> None:
        """A text value goes out as it is written; what may still be an end tag, the layout's
        final newline or the start of ``null`` waits."""
        if not _text_value(self._kind):
            return
        body = text[self._value_at :]
        hold = partial_marker_length(body, _VALUE_ENDS)
        safe = body[: len(body) - hold]
        if safe.endswith("\n"):
            safe = safe[:-1]
        if self._streamed < 0:
            if _NULL.startswith(safe.lower()):
                return
            self.pieces.append('"')
            self._streamed = 0
        if len(safe) > self._streamed:
            self.pieces.append(json.dumps(safe[self._streamed :], ensure_ascii=False)[1:-1])
            self._streamed = len(safe)

    def _finish_value(self, raw: str) -> None:
        if self._streamed < 0:
            self.pieces.append(typed_value(raw, self._kind))
            return
        self.pieces.append(json.dumps(raw[self._streamed :], ensure_ascii=False)[1:-1] + '"')

    def _not_a_call(self) -> Outcome:
        return Complete(self._end) if self._committed else REJECT


def _region(opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> Region:
    return Qwen3CoderRegion(opener, names, parameters)


FORMAT = ToolCallFormat("qwen3_coder", (TOOL_CALL, FUNCTION), "", None, _region)
