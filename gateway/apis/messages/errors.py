"""The one mapping from the gateway's errors to Anthropic's error body and status, for every path
of the Messages API (responses, middleware refusals and the `error` event of a failed stream).

Anthropic's statuses where they differ from the gateway's OpenAI ones:
- Triton failed the request (502): 500 `api_error`.
- Triton unreachable or the model not ready (503): 529 `overloaded_error`. It is transient, the
  way Anthropic's own overload is, and clients treat it so (the SDKs and Claude Code retry 529
  with backoff; the SDK raises `OverloadedError`).
- The gateway's own admission limit (too many concurrent and queued requests in this process):
  429 `rate_limit_error`, kept from the OpenAI side rather than moved to 529. It is a per-client
  limit on requests in flight, which is what Anthropic's 429 means; it carries `Retry-After`,
  which the SDKs honour on 429; and one status for the same refusal on every API keeps load
  balancers, dashboards and the `status` metric label consistent. 529 is left to mean
  "the model server behind the gateway is unavailable".
- Deadline exceeded (504): 504 `timeout_error`, Anthropic's type for it.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.apis.messages.protocol import ErrorResponse
from gateway.errors import GatewayError, InvalidRequestError, PayloadTooLargeError, to_gateway_error
from gateway.http.routing import Handler, JsonBodyRoute
from gateway.logs import note_error

logger = logging.getLogger(__name__)

# For the OpenAPI document: every error the Messages routes return has Anthropic's shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error: too many requests in flight, or the key's rate limit; see Retry-After"),
        (500, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error: Triton unavailable"),
    )
}

# Gateway status -> (Anthropic status, Anthropic error type).
_BY_STATUS: Final[dict[int, tuple[int, str]]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    413: (413, "request_too_large"),
    422: (400, "invalid_request_error"),
    429: (429, "rate_limit_error"),
    500: (500, "api_error"),
    502: (500, "api_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}


def status_and_type(error: GatewayError) -> tuple[int, str]:
    found = _BY_STATUS.get(error.status_code)
    if found is not None:
        return found
    return (400, "invalid_request_error") if error.status_code < 500 else (500, "api_error")


def error_body(error: GatewayError) -> dict[str, Any]:
    _, kind = status_and_type(error)
    note_error(kind, error.code)
    return {"type": "error", "error": {"type": kind, "message": error.message}}


PATH_PREFIX: Final = "/v1/messages"


def error_shape(path: str, error: GatewayError) -> tuple[int, dict[str, Any]]:
    """Anthropic's status and body, for the app's handlers and middleware on this API's paths."""
    return status_and_type(error)[0], error_body(error)


def error_response(error: GatewayError) -> JSONResponse:
    status, _ = status_and_type(error)
    return JSONResponse(error_body(error), status_code=status, headers=error.headers or None)


def error_event(error: GatewayError) -> bytes:
    """A failure after the stream started: Anthropic's `error` event (the stream then ends)."""
    return b"event: error\ndata: " + orjson.dumps(error_body(error)) + b"\n\n"


def _location(loc: tuple[Any, ...]) -> str:
    # Anthropic names fields as dotted paths with list indexes as numbers: `messages.0.content.1`.
    # pydantic's union branch labels (`str`, `list[...]`, `tagged-union[...]`) are not fields.
    parts = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, int):
            parts.append(str(part))
        elif isinstance(part, str) and not (
            part.startswith(("function-", "tagged-union", "list[", "dict[", "literal["))
            or part in _TYPE_LABELS
        ):
            parts.append(part)
    return ".".join(parts)


_TYPE_LABELS: Final = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "model"})
_LABEL_PREFIXES: Final = ("function-", "tagged-union", "list[", "dict[", "literal[")


def validation_error(exc: RequestValidationError) -> GatewayError:
    """The request body's first real problem. For a field that may be a string or a list of
    blocks, pydantic reports both branches; the one that got further into the value names the
    actual problem (`messages.0.content.1: Input tag 'foo' ...`), so the deepest error wins."""
    errors = list(exc.errors())
    if not errors:
        return InvalidRequestError("invalid request")
    if errors[0].get("type") == "json_invalid":
        return InvalidRequestError("The request body is not valid JSON.")
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "missing" and loc == ("body",):
        return InvalidRequestError("The request needs a JSON body.")
    where = _location(loc)
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "missing":
        message = "Field required"
    return InvalidRequestError(f"{where}: {message}" if where else message, param=where or None)


class AnthropicRoute(JsonBodyRoute):
    """A JSON-body route whose every error leaves in Anthropic's shape: the Messages API's one
    error mapping point for requests that reach its routes (the app's handlers answer in
    OpenAI's shape)."""

    def get_route_handler(self) -> Handler:
        inner = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await inner(request)
            except RequestValidationError as exc:
                return error_response(validation_error(exc))
            except GatewayError as exc:
                return error_response(exc)
            except StarletteHTTPException as exc:
                if exc.status_code == 413:
                    return error_response(PayloadTooLargeError(str(exc.detail)))
                error = InvalidRequestError(str(exc.detail))
                error.status_code = exc.status_code
                return error_response(error)
            except Exception as exc:
                logger.exception("unhandled error on %s %s", request.method, request.url.path)
                return error_response(to_gateway_error(exc))

        return handler
