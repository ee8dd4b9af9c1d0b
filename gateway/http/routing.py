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
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.routing import BaseRoute, Match
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


@dataclass(frozen=True, slots=True)
class RouteHint:
    """What a request that matched no route most likely meant: `path` (the request's own values in
    the route's parameters) and `advice`, a sentence for the 404's message."""

    path: str
    advice: str


# The prefix of every API route; a client's base URL ends in it (OpenAI clients) or the client adds
# it (Anthropic clients), so a base URL written wrong doubles it or leaves it out.
API_PREFIX = "/v1"
# How alike a misspelt path segment must be to the route's (difflib's ratio): `completion` is
# 0.95 to `completions`, `models` 0.38 to `completions`.
SIMILAR_SEGMENT = 0.75


def route_hint(routes: Iterable[BaseRoute], method: str, path: str) -> RouteHint | None:
    """For a 404: a path with the API prefix twice or without it is a base-URL mistake, and the
    fix is said as one; a misspelt path gets the nearest route ("did you mean"). None when nothing
    is near enough to be a useful guess."""
    known = [r for r in flatten_routes(routes) if isinstance(getattr(r, "path", None), str)]
    twice = API_PREFIX + API_PREFIX
    if path == twice or path.startswith(twice + "/"):
        meant = _served(known, method, path[len(API_PREFIX) :])
        if meant is not None:
            return RouteHint(
                meant[1],
                f"The path has {API_PREFIX} twice: remove one {API_PREFIX} from the client's base URL "
                f"(did you mean {meant[0]} {meant[1]}?).",
            )
    elif not path.startswith(API_PREFIX + "/"):
        meant = _served(known, method, API_PREFIX + path)
        if meant is not None:
            return RouteHint(
                meant[1],
                f"The path lacks {API_PREFIX}: add {API_PREFIX} to the client's base URL "
                f"(did you mean {meant[0]} {meant[1]}?).",
            )
    near = _nearest(known, method, path)
    if near is None:
        return None
    return RouteHint(near[1], f"Did you mean {near[0]} {near[1]}?")


def _served(known: Sequence[BaseRoute], method: str, path: str) -> tuple[str, str] | None:
    """(method, path) of a route that serves `path`: the request's method if the route takes it."""
    scope = {"type": "http", "path": path, "root_path": "", "method": method}
    for route in known:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return method, path
        if match is Match.PARTIAL:
            return _shown_method(route, method), path
    return None


def _nearest(known: Sequence[BaseRoute], method: str, path: str) -> tuple[str, str] | None:
    asked = path.strip("/").split("/")
    best: tuple[float, str, str] | None = None
    for route in known:
        template = route.path.strip("/").split("/")  # type: ignore[attr-defined]
        if len(template) != len(asked):
            continue
        ratios = [
            1.0 if part.startswith("{") else SequenceMatcher(None, given, part).ratio()
            for given, part in zip(asked, template, strict=True)
        ]
        if min(ratios) < SIMILAR_SEGMENT:
            continue
        score = sum(ratios) / len(ratios)
        filled = "/" + "/".join(
            given if part.startswith("{") else part for given, part in zip(asked, template, strict=True)
        )
        if best is None or score > best[0]:
            best = (score, _shown_method(route, method), filled)
    return None if best is None else (best[1], best[2])


def _shown_method(route: BaseRoute, method: str) -> str:
    methods = sorted(getattr(route, "methods", None) or ())
    return method if method in methods or not methods else ("POST" if "POST" in methods else methods[0])
