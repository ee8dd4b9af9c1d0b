"""The one mapping from the gateway's errors to OpenAI's error body and status: the exception
handlers (every error leaves as {"error": {message, type, param, code}}) and `error_body`, which the
middleware and the stream writers use too."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from gateway.apis.openai.protocol import ErrorResponse
from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    to_gateway_error,
)
from gateway.http.middleware import ErrorShape
from gateway.http.routing import flatten_routes, route_hint
from gateway.logs import note_error

logger = logging.getLogger(__name__)

# For the OpenAPI document: every error the /v1 routes return has OpenAI's error shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "Invalid request"),
        (401, "Missing or wrong API key"),
        (404, "Unknown model"),
        (413, "Request body too large"),
        (429, "Overloaded; see Retry-After"),
        (500, "Internal error"),
        (502, "Triton failed the request"),
        (503, "Triton unavailable"),
        (504, "Deadline exceeded"),
    )
}


def error_body(error: GatewayError) -> dict[str, Any]:
    note_error(error.error_type, error.code)
    return {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        }
    }


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status_code, headers=error.headers or None)


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif (
            isinstance(part, str)
            and not part.startswith(("function-", "tagged-union"))
            and part
            not in (
                "str",
                "list[str]",
                "list[int]",
                "list[list[int]]",
                "int",
                "bool",
                "float",
            )
        ):
            out += f".{part}" if out else part
    return out or None


def validation_error(exc: RequestValidationError) -> GatewayError:
    errors = exc.errors()
    if not errors:
        return InvalidRequestError("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return InvalidRequestError(
            "We could not parse the JSON body of your request. "
            "(HINT: This likely means you aren't using your HTTP library correctly. "
            "The OpenAI API expects a JSON payload.)"
        )
    loc = tuple(first.get("loc", ()))
    param = _param_from_loc(loc)
    if first.get("type") == "missing" and loc == ("body",):
        return InvalidRequestError("the request needs a JSON body")
    msg = str(first.get("msg", "invalid value"))
    detail = f"{msg}: {param}" if param else msg
    return InvalidRequestError(f"Invalid request: {detail}", param=param)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (for the 405's Allow header, RFC 9110):
    Starlette's own header names only the first route that matched the path."""
    methods: set[str] = set()
    for route in flatten_routes(request.app.routes):
        match, _ = route.matches({**request.scope, "method": "__none__"})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_error_handlers(app: FastAPI, error_shape: ErrorShape) -> None:
    """The app's handlers: OpenAI's bodies, except on the paths `error_shape` gives another API
    (errors outside that API's routes there: an unknown method or sub-path, a body too large)."""

    def error_response(error: GatewayError, request: Request, shape_path: str | None = None) -> JSONResponse:
        status, body = error_shape(shape_path or request.url.path, error)
        return JSONResponse(body, status_code=status, headers=error.headers or None)

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error: GatewayError
        if exc.status_code == 404:
            path = request.url.path
            hint = route_hint(request.app.routes, request.method, path)
            advice = f" {hint.advice}" if hint is not None else ""
            error = NotFoundError(f"Unknown request URL: {request.method} {path}.{advice}")
            # In the shape of the API the client meant: an Anthropic client whose base URL ends
            # in /v1 reads Anthropic's error body.
            return error_response(error, request, hint.path if hint is not None else None)
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            error = MethodNotAllowedError(
                f"Method {request.method} is not allowed for {request.url.path}"
                + (f"; use {', '.join(allowed)}." if allowed else "."),
                headers={"Allow": ", ".join(allowed)} if allowed else None,
            )
        elif exc.status_code == 413:
            error = PayloadTooLargeError(str(exc.detail))
        else:
            error = InvalidRequestError(str(exc.detail))
            error.status_code = exc.status_code
        return error_response(error, request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(to_gateway_error(exc), request)
