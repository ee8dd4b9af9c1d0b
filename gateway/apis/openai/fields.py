"""Body fields a request sends that the gateway does not use: accepted (agent clients send many)
and named back to the client, a near-miss of a known field refused, and, when asked, OpenAI's own
400 for any field OpenAI does not define."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from gateway.apis.openai.protocol import KNOWN_EXTENSION_FIELDS
from gateway.errors import InvalidRequestError
from gateway.logs import current_request


def ignored_fields(request: BaseModel, defined: frozenset[str], *, strict: bool) -> tuple[str, ...]:
    """The body's top-level fields the gateway does not use (`defined`: the fields OpenAI defines
    for this request), told to the client rather than silently dropped. A near-miss of a field it
    knows (`max_token`, `temprature`) is a 400 naming that field, for a typo would otherwise
    quietly change the result; with `strict`, so is any field OpenAI does not define, with
    OpenAI's own message."""
    extra = request.model_extra
    if not extra:
        return ()
    known = defined | type(request).model_fields.keys()
    unrecognized = []
    for name in extra:
        if name in defined:
            continue
        near = None if name in KNOWN_EXTENSION_FIELDS else resembles(name, known)
        if near is not None:
            raise InvalidRequestError(
                f"Unrecognized request argument supplied: {name} (did you mean `{near}`?)",
                param=name,
                code="unknown_parameter",
            )
        unrecognized.append(name)
    if strict and unrecognized:
        plural = "s" if len(unrecognized) > 1 else ""
        raise InvalidRequestError(
            f"Unrecognized request argument{plural} supplied: {', '.join(unrecognized)}",
            param=unrecognized[0],
            code="unknown_parameter",
        )
    return tuple(extra)


def note_ignored_fields(names: tuple[str, ...]) -> None:
    """Body fields the gateway ignored: the access log and the `x-gateway-ignored-fields`
    response header name them (the middleware writes both)."""
    record = current_request.get()
    if record is not None and names:
        record.ignored_fields = names


def check_stream_options(stream: bool | None, stream_options: object | None) -> None:
    """As OpenAI: stream_options only with stream (a client asking for usage chunks of a
    response that has no chunks has made a mistake worth hearing about)."""
    if stream_options is not None and not stream:
        raise InvalidRequestError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )


def resembles(name: str, known: Iterable[str]) -> str | None:
    """The known field `name` is most likely a misspelling of: the same letters but for case,
    `-` or `_`, or one edit away (a letter added, dropped, changed or two swapped). Names under
    four letters are too short to tell."""
    if len(name) < 4:
        return None
    squashed = _squash(name)
    for field in sorted(known):
        if _squash(field) == squashed:
            return field
    for field in sorted(known):
        if len(field) >= 4 and _one_edit(name.lower(), field):
            return field
    return None


def _squash(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _one_edit(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k in range(len(short)) if short[k] != long[k]), len(short))
    return short[i:] == long[i + 1 :]
