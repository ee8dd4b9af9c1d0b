"""Tracing: the span tree of a request, and the trace context Triton receives in gRPC metadata."""

from __future__ import annotations

from pathlib import Path

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import create_app
from gateway.config import ServedModel, Settings
from tests.support.fake_triton import FakeTriton, start_fake_triton
from tests.support.tokenizers import loaded_tokenizer

EXPORTER = InMemorySpanExporter()


def _provider() -> TracerProvider:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    return provider


_provider()


async def test_a_request_traces_tokenize_generate_and_triton_with_the_context_sent_to_triton(
    tiny_bpe_dir: Path,
) -> None:
    tok = loaded_tokenizer(tiny_bpe_dir)
    fake = FakeTriton(tokens=tok.encode("Hello there", add_special_tokens=False))
    server, url = await start_fake_triton(fake)
    EXPORTER.clear()
    settings = Settings(
        models=[ServedModel(name="tiny", tokenizer=tiny_bpe_dir)], triton_url=[url], tracing=True
    )
    app = create_app(settings)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
        ):
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
                headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
            )
    finally:
        await server.stop(None)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "Hello there"
    finished = EXPORTER.get_finished_spans()
    spans = {s.name: s for s in finished}
    by_id = {s.context.span_id: s for s in finished}
    root = spans["POST /v1/chat/completions"]
    assert format(root.context.trace_id, "032x") == trace_id  # continues the client's trace

    def ancestors(span: object) -> list[str]:
        names = []
        while span.parent is not None and span.parent.span_id in by_id:  # type: ignore[attr-defined]
            span = by_id[span.parent.span_id]  # type: ignore[attr-defined]
            names.append(span.name)  # type: ignore[attr-defined]
        return names

    # One server span per request: the gateway's own (FastAPI's native telemetry is off).
    assert [s.name for s in finished].count("POST /v1/chat/completions") == 1
    assert sorted(spans) == ["POST /v1/chat/completions", "generate", "tokenize", "triton.infer"]
    assert ancestors(spans["tokenize"]) == ["POST /v1/chat/completions"]
    assert ancestors(spans["generate"]) == ["POST /v1/chat/completions"]
    assert ancestors(spans["triton.infer"]) == ["POST /v1/chat/completions"]
    infer = spans["triton.infer"]
    assert infer.attributes["model"] == "ensemble"
    # Triton got the trace context of its own span, ready for its OpenTelemetry tracing to join.
    traceparent = fake.metadata[-1]["traceparent"]
    assert traceparent == f"00-{trace_id}-{infer.context.span_id:016x}-01"
    assert fake.requests[-1].parameters["triton_enable_empty_final_response"].bool_param


def test_outside_any_span_nothing_is_propagated() -> None:
    from gateway import tracing

    span = tracing.start_span("triton.infer")
    assert span.grpc_metadata() is None
    span.end()
