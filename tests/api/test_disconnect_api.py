"""A client that leaves before its non-streamed reply: 499 in the access log, the metrics and the
trace (nginx's convention), Triton cancelled, and nothing logged as an error."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.api.conftest import MakeClient

SPANS = InMemorySpanExporter()
_provider = trace.get_tracer_provider()
if not isinstance(_provider, TracerProvider):
    _provider = TracerProvider()
    trace.set_tracer_provider(_provider)
_provider.add_span_processor(SimpleSpanProcessor(SPANS))


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"model": "tiny", "prompt": "hi"}),
    ],
)
async def test_a_client_gone_before_a_non_streamed_reply_is_a_499_everywhere(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture, path: str, body: dict[str, Any]
) -> None:
    client, engine = await make_client(settings={"tracing": True}, gate=asyncio.Event())
    app = client._transport.app  # type: ignore[attr-defined]
    raw = orjson.dumps({**body, "max_tokens": 4})
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await engine.started.wait()  # the request is in the engine: now the client leaves
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"gateway.test")],
        "client": ("127.0.0.1", 1234),
        "server": ("gateway.test", 80),
    }
    SPANS.clear()
    caplog.set_level(logging.INFO)
    await app(scope, receive, send)

    assert sent[0]["status"] == 499
    assert len(engine.cancelled) == 1
    access = [r for r in caplog.records if r.name == "gateway.access"]
    assert [r.getMessage() for r in access] == [f"POST {path} 499"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    metrics = (await client.get("/metrics")).text
    assert f'gateway_requests_total{{model="tiny",route="{path}",status="499"}} 1.0' in metrics
    assert 'status="400"' not in metrics
    (root,) = [s for s in SPANS.get_finished_spans() if s.name == f"POST {path}"]
    assert root.attributes is not None and root.attributes["http.response.status_code"] == 499
    assert root.status.status_code != trace.StatusCode.ERROR
