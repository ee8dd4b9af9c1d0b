"""How the generation endpoints are routed: a route class that parses the JSON body straight
into its model, and a middleware that calls those routes without FastAPI's router.

FastAPI's general request handling (dependency solving, `json.loads` then validation, response
model checks) cost about 0.1 ms per request here, on the path before the Triton request is sent,
where it adds to every time to first token. These routes take exactly one JSON body model and
the request, so their handler is this much: pydantic parses the bytes in one pass. Everything
else stays FastAPI's: the OpenAPI document comes from the same signature, and errors go through
the app's handlers (a `RequestValidationError` shaped as FastAPI's own).
"""

from __future__ import annotations

import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import InvalidRequestError
from gateway.http.admission import admit

Endpoint = Callable[[Any, Request], Awaitable[Any]]
Handler = Callable[[Request], Coroutine[Any, Any, Response]]
# The app's exception handlers (all async here), by exception class.
Handlers = Mapping[Any, Callable[[Request, Any], Any]]


def _is_json(content_type: str | None) -> bool:
    # As FastAPI decides it: application/json or any +json type; no content type is not JSON.
    if not content_type:
        return False
    subtype = content_type.partition(";")[0].strip().lower().partition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


class JsonBodyRoute(APIRoute):
    """For endpoints shaped `async def f(body: SomeModel, request: Request)`."""

    def get_route_handler(self) -> Handler:
        endpoint: Endpoint = self.endpoint
        model: type[BaseModel] = typing.get_type_hints(endpoint)["body"]

        async def handler(request: Request) -> Response:
            raw = await request.body()
            if not raw:
                raise RequestValidationError(
                    [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}]
                )
            if not _is_json(request.headers.get("content-type")):
                raise InvalidRequestError(
                    "The request body must be JSON, sent with the header Content-Type: application/json."
                )
            try:
                body = model.model_validate_json(raw)
            except ValidationError as exc:
                errors = exc.errors(include_url=False)
                raise RequestValidationError(
                    [{**e, "loc": ("body", *e["loc"])} for e in errors], body=raw
                ) from None
            # Admission waits here, where the body's priority is known (AdmissionMiddleware).
            await admit(request, body)
            result = await endpoint(body, request)
            if isinstance(result, Response):
                return result
            return Response(result.model_dump_json(by_alias=True), media_type="application/json")

        return handler


class DirectRoutes:
    """ASGI middleware, innermost: calls the JsonBodyRoute endpoints' handlers without FastAPI's
    router. Its matching (nested included routers, route contexts) and request wrapper cost about
    0.1 ms per request on this machine, all before the Triton request goes out. The handlers and
    the app's exception handlers are FastAPI's own; other paths and methods go on to the router
    (a GET on /v1/completions still gets its 405 there)."""

    def __init__(self, app: ASGIApp, *, routes: Iterable[BaseRoute], exception_handlers: Handlers) -> None:
        self.app = app
        self._handlers = exception_handlers
        self._routes: dict[tuple[str, str], tuple[JsonBodyRoute, Handler]] = {}
        for route in flatten_routes(routes):
            if isinstance(route, JsonBodyRoute):
                handler = route.get_route_handler()
                for method in route.methods or ():
                    self._routes[(method, route.path)] = (route, handler)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hit = self._routes.get((scope.get("method", ""), scope["path"])) if scope["type"] == "http" else None
        if hit is None:
            await self.app(scope, receive, send)
            return
        route, handler = hit
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except Exception as exc:
            # As Starlette's ExceptionMiddleware: the handler for the nearest class, else re-raise
            # (the server error middleware answers with a 500).
            found = next((self._handlers[c] for c in type(exc).__mro__ if c in self._handlers), None)
            if found is None:
                raise
            response = await found(request, exc)
        await response(scope, receive, send)


def generation_paths(routes: Iterable[BaseRoute]) -> frozenset[str]:
    """The paths of the generation routes (every JsonBodyRoute): admission control bounds these
    (the route class waits for admission once it has parsed the body),
    so a new API's generation endpoint is admitted as soon as its router uses the route class."""
    return frozenset(route.path for route in flatten_routes(routes) if isinstance(route, JsonBodyRoute))


def flatten_routes(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    # FastAPI keeps an included router as one entry holding the router's own routes.
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from flatten_routes(included.routes)
        else:
            yield route
