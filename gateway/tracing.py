"""Optional OpenTelemetry tracing: a span per request with children for tokenization, the Triton
call and streaming; the trace context travels to Triton in the gRPC metadata (`traceparent`), so
Triton's own OpenTelemetry tracing joins the same trace.

The `otel` extra installs OpenTelemetry; without it every helper here is a no-op. The exporter is
OTLP, configured by the standard OTEL_* environment variables.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

_TRACER_NAME = "trtllm-openai-gateway"


def enabled() -> bool:
    return trace is not None


def configure(service_name: str) -> bool:
    """Install an OTLP-exporting tracer provider (once per process). False without the extra."""
    if trace is None:
        logger.warning("tracing asked for, but the otel extra is not installed")
        return False
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[None]:
    # Only under a request's span (tracing on): otherwise OpenTelemetry's no-op path still costs
    # tens of microseconds per call.
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        yield
        return
    with trace.get_tracer(_TRACER_NAME).start_as_current_span(name, attributes=attributes):
        yield


@contextlib.contextmanager
def server_span(name: str, headers: list[tuple[bytes, bytes]]) -> Iterator[Any]:
    """The request's root span, continuing the client's trace when it sent `traceparent`.
    Yields the span (None without the extra), for `set_http_status` once the response is done."""
    if trace is None:
        yield None
        return
    carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
    parent = propagate.extract(carrier)
    token = otel_context.attach(parent)
    try:
        with trace.get_tracer(_TRACER_NAME).start_as_current_span(name, kind=trace.SpanKind.SERVER) as root:
            yield root
    finally:
        otel_context.detach(token)


def set_http_status(root: Any, status: int) -> None:
    """The status the client saw (499: it went away first) on the request's span; only 5xx is a
    server span's error (OpenTelemetry's HTTP conventions)."""
    if root is None:
        return
    root.set_attribute("http.response.status_code", status)
    if status >= 500:
        root.set_status(trace.Status(trace.StatusCode.ERROR))


class Span:
    """A span started under the current one but never made current itself: async generators
    suspend between tokens, and a context attached inside one would leak into whatever the task
    runs next. Carry it explicitly and `end` it."""

    __slots__ = ("_span",)

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self._span: Any = None
        if trace is not None and trace.get_current_span().get_span_context().is_valid:
            self._span = trace.get_tracer(_TRACER_NAME).start_span(name, attributes=attributes)

    def grpc_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """This span's context as gRPC metadata (`traceparent`), for Triton to continue the trace."""
        if self._span is None:
            return None
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(self._span))
        return tuple(carrier.items()) or None

    def error(self, exc: BaseException) -> None:
        if self._span is not None:
            self._span.record_exception(exc)
            self._span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))

    def end(self) -> None:
        if self._span is not None:
            self._span.end()


def start_span(name: str, **attributes: Any) -> Span:
    return Span(name, attributes)
