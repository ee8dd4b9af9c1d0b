"""ASGI middleware in front of the routers: API keys, body size, admission control, metrics.

Pure ASGI (not BaseHTTPMiddleware) so streamed responses pass through untouched and the
per-request cost stays a few function calls.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import tracing
from gateway.errors import AuthenticationError, GatewayError, PayloadTooLargeError
from gateway.http.admission import (
    TICKET_KEY,
    AdmissionEvents,
    AdmissionQueue,
    ShedReason,
    Ticket,
    priority_label,
    retry_after_s,
)
from gateway.logs import ACCESS_LOGGER, RequestRecord, current_request
from gateway.metrics import GatewayMetrics
from gateway.modelserver import ModelLoad

access_log = logging.getLogger(ACCESS_LOGGER)
# Names the request body's fields the gateway ignored (unknown to it, or defined by OpenAI but
# without effect here): clients learn that a setting they sent did nothing.
IGNORED_FIELDS_HEADER = b"x-gateway-ignored-fields"


# The status and body an error leaves with on a path: each API has its own error shape (OpenAI's
# on /v1/chat/completions, Anthropic's on /v1/messages); the app says which path is whose
# (gateway.apis.error_shape).
ErrorShape = Callable[[str, GatewayError], tuple[int, dict[str, Any]]]


async def send_error(send: Send, error: GatewayError, path: str, error_shape: ErrorShape) -> None:
    status, body = error_shape(path, error)
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": orjson.dumps(body)})


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The API key a request presents: `Authorization: Bearer KEY` or `x-api-key: KEY`, whichever
    comes first (b"" for another authorization scheme); None when it presents none."""
    for name, value in headers:
        if name == b"authorization":
            return value[7:].strip() if value.lower().startswith(b"bearer ") else b""
        if name == b"x-api-key":
            return value.strip()
    return None


# Paths open without a key: health for probes, the API's schema; /metrics unless protected.
OPEN_PATHS = frozenset(["/health", "/health/ready", "/openapi.json"])


class ApiKeyMiddleware:
    """API keys on every path but the open ones (health, the schema, /metrics unless asked), as
    `Authorization: Bearer KEY` or, as Anthropic's clients send it, `x-api-key: KEY` (the same
    keys). Every path, not /v1 alone: routes outside it (vLLM's /rerank, /v2/rerank, /score,
    /tokenize) serve models too."""

    def __init__(
        self, app: ASGIApp, keys: list[str], *, protect_metrics: bool, error_shape: ErrorShape
    ) -> None:
        self.app = app
        self._error_shape = error_shape
        self._keys = [k.encode() for k in keys]
        self._protect_metrics = protect_metrics

    def _protected(self, path: str) -> bool:
        if path == "/metrics":
            return self._protect_metrics
        return path not in OPEN_PATHS

    def _valid(self, given: bytes | None) -> bool:
        if not given:
            return False
        # Compare against every key, always, so timing reveals neither which key nor how much matched.
        ok = False
        for key in self._keys:
            ok |= hmac.compare_digest(given, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._protected(scope["path"]):
            given = presented_key(scope["headers"])
            if not self._valid(given):
                message = (
                    "You didn't provide an API key. Provide it in the Authorization header "
                    "(Bearer YOUR_KEY) or the x-api-key header."
                    if given is None
                    else "Incorrect API key provided."
                )
                await send_error(send, AuthenticationError(message), scope["path"], self._error_shape)
                return
        await self.app(scope, receive, send)


class BodySizeMiddleware:
    """413 for bodies over the limit, by Content-Length or by counting a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int, *, error_shape: ErrorShape) -> None:
        self.app = app
        self._error_shape = error_shape
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        too_large = PayloadTooLargeError(f"Request body is larger than the limit of {limit} bytes.")
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit():
            if int(length) > limit:
                await send_error(send, too_large, scope["path"], self._error_shape)
                return
            # The HTTP server delivers no more than Content-Length bytes: nothing left to count,
            # and streamed responses pass without an extra wrapper per chunk.
            await self.app(scope, receive, send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # FastAPI re-raises HTTPException from body reading (others become a 400),
                    # and the app's handler turns it into the OpenAI-shaped 413.
                    raise HTTPException(413, too_large.message)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except HTTPException as exc:
            # Raised outside a route's body parsing (nothing caught it): answer here.
            if exc.status_code != 413 or started:
                raise
            await send_error(send, too_large, scope["path"], self._error_shape)


class AdmissionMiddleware:
    """Bounds concurrent generation requests per process and the queue in front of them, by
    priority (`gateway.http.admission`).

    The priority is in the JSON body, which the route parses: this middleware gives each
    generation request a ticket (with its API key's default priority) and the route waits on it
    once the body is parsed (`admission.admit`). The slot is held until the response (the whole
    stream) is done; a request refused, displaced from a full queue or timed out in it gets a 429
    with Retry-After in its API's error shape. Each body is read before its request waits (at
    most --max-body-bytes); a refused one is dropped at once, so what is kept stays bounded by the
    running and queued requests.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        paths: frozenset[str],
        max_concurrent: int,
        max_queued: int,
        queue_timeout_s: float,
        metrics: GatewayMetrics,
        key_priorities: Mapping[str, int] | None = None,
        objective_priorities: Mapping[str, int] | None = None,
        load: ModelLoad | None = None,
    ) -> None:
        self.app = app
        self._load = load
        # InferenceObjective priorities (higher is more urgent) as admission priorities (lower is).
        self._objectives = {k.encode(): -p for k, p in (objective_priorities or {}).items()}
        # The generation routes' paths, taken from the app's routes (routing.generation_paths).
        self._paths = paths
        self._events = _AdmissionMetrics(metrics)
        self._queue = AdmissionQueue(
            max_running=max_concurrent,
            max_queued=max_queued,
            timeout_s=queue_timeout_s,
            on_length=self._events.queue_length,
        )
        self._retry_after = retry_after_s(queue_timeout_s)
        self._key_priorities = {k.encode(): p for k, p in (key_priorities or {}).items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self._paths:
            await self.app(scope, receive, send)
            return
        default = 0
        if self._key_priorities:
            # The key middleware, outside this one, has already refused an unknown key.
            key = presented_key(scope["headers"])
            default = self._key_priorities.get(key, 0) if key else 0
        if self._objectives:
            objective = _objective(scope["headers"])
            if objective in self._objectives:
                default = self._objectives[objective]
        ticket = Ticket(
            self._queue,
            default_priority=default,
            retry_after_s=self._retry_after,
            events=self._events,
            load=self._load,
        )
        scope[TICKET_KEY] = ticket
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.release()


# The header an Inference Gateway request names its InferenceObjective in (llm-d-router's
# pkg/epp/metadata/consts.go, v0.10.0), and the Gateway API Inference Extension's older name.
OBJECTIVE_HEADERS = (b"x-llm-d-inference-objective", b"x-gateway-inference-objective")


def _objective(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name in OBJECTIVE_HEADERS:
            return value.strip()
    return None


class _AdmissionMetrics(AdmissionEvents):
    """Admission by priority in the gateway's metrics (labels bounded by priority_label)."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def admitted(self, priority: int, waited_s: float) -> None:
        label = priority_label(priority)
        self._m.admitted.labels(label).inc()
        self._m.queue_wait.labels(label).observe(waited_s)

    def shed(self, priority: int, reason: ShedReason) -> None:
        self._m.shed.labels(priority_label(priority), reason).inc()

    def queue_length(self, waiting: int) -> None:
        self._m.queued.set(waiting)


class ObservabilityMiddleware:
    """Request ids (`X-Request-Id` in, or made, and out), the in-flight gauge, requests by route,
    model and status, and one access line per request, streams included (the ASGI call lasts
    until the last byte is sent). One send wrapper for all of it: every wrapper layer costs each
    streamed token."""

    SILENT = frozenset({"/health", "/health/ready", "/metrics"})

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: GatewayMetrics,
        paths: frozenset[str],
        access_log: bool,
        tracing: bool = False,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.paths = paths
        self.access_log = access_log
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        # Accept a client's id only if it is short and printable: it lands in logs and headers.
        if given is not None and 0 < len(given) <= 128 and given.isascii() and given.decode().isprintable():
            request_id = given.decode()
        else:
            request_id = uuid.uuid4().hex
        record = RequestRecord(request_id, scope["method"], scope["path"])
        token = current_request.set(record)
        header = (b"x-request-id", request_id.encode())
        record.status = 500

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
                if record.ignored_fields:
                    ignored = ", ".join(record.ignored_fields).encode("latin-1", "replace")
                    message["headers"].append((IGNORED_FIELDS_HEADER, ignored))
            await send(message)

        m = self.metrics
        m.in_flight.inc()
        try:
            if self.tracing:
                with tracing.server_span(f"{scope['method']} {scope['path']}", scope["headers"]) as root:
                    try:
                        await self.app(scope, receive, send_with_id)
                    finally:
                        tracing.set_http_status(root, record.status)
            else:
                await self.app(scope, receive, send_with_id)
        finally:
            m.in_flight.dec()
            current_request.reset(token)
            route = scope.get("route")
            # Requests refused before routing (401, 413, 429) still count under their path;
            # unknown paths share one label so clients cannot grow the label set.
            path = getattr(route, "path", None) or (
                scope["path"] if scope["path"] in self.paths else "unmatched"
            )
            m.requests.labels(path, record.model or "none", str(record.status)).inc()
            if self.access_log and scope["path"] not in self.SILENT:
                access_log.info(
                    "%s %s %s", record.method, record.path, record.status, extra={"fields": record.fields()}
                )


class ConnectionRequestLimit:
    """Closes a client connection after `max_requests` requests on it (as nginx's keepalive_requests
    and Envoy's max_requests_per_connection do): its last response says `connection: close`, which
    uvicorn honours, and the client reconnects. With SO_REUSEPORT workers the kernel hashes each new
    connection anew, so a few long-lived connections (a load balancer's, a benchmark's pool) do not
    stay on the workers they first landed on.

    A connection is known by the client's address and port, which it keeps while it lives; the
    table is bounded (a connection forgotten early is only counted again from one)."""

    def __init__(self, app: ASGIApp, max_requests: int, *, table_size: int = 65536) -> None:
        self.app = app
        self.max_requests = max_requests
        self._table_size = table_size
        self._served: dict[tuple[Any, ...], int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] != "http" or not client:
            await self.app(scope, receive, send)
            return
        key = (*client, *(scope.get("server") or ()))
        served = self._served.pop(key, 0) + 1
        if served < self.max_requests:
            if len(self._served) >= self._table_size:
                del self._served[next(iter(self._served))]  # the oldest: dicts keep insertion order
            self._served[key] = served
            await self.app(scope, receive, send)
            return

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing_send)
