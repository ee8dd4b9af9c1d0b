"""A Triton that cannot be reached is named with its URL and gRPC's reason, in operators' terms."""

from __future__ import annotations

import asyncio
import http.server
import logging
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app import create_app
from gateway.config import ServedModel, Settings
from gateway.errors import EngineUnavailableError
from gateway.triton.engine import TritonAdapter
from gateway.triton.pool import TritonPool


@pytest.fixture
def http_port() -> Iterator[int]:
    """A plain HTTP/1 server, as Triton's HTTP port is to a gRPC client."""
    server = socketserver.TCPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


async def _introspect(url: str) -> str:
    pool = TritonPool([url], timeout_s=5)
    try:
        with pytest.raises(EngineUnavailableError) as caught:
            await TritonAdapter(pool, "ensemble", route="ensemble").introspect()
    finally:
        await pool.close()
    return caught.value.message


async def test_a_refused_connection_names_the_url_and_the_reason() -> None:
    message = await _introspect("127.0.0.1:1")
    assert message.startswith("Triton at 127.0.0.1:1 is unavailable: ")
    assert "Connection refused" in message


async def test_an_unresolvable_name_says_so() -> None:
    message = await _introspect("triton.invalid:8001")
    assert message.startswith("Triton at triton.invalid:8001 is unavailable: ")
    assert "resolv" in message.lower()


async def test_an_http_port_is_suspected_as_such(http_port: int) -> None:
    message = await _introspect(f"127.0.0.1:{http_port}")
    assert f"127.0.0.1:{http_port}" in message and "is this Triton's HTTP port?" in message


async def test_the_gateway_logs_which_triton_it_waits_for_and_why(
    tiny_bpe_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.app")
    settings = Settings(models=[ServedModel(name="tiny", tokenizer=tiny_bpe_dir)], triton_url=["127.0.0.1:1"])
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        for _ in range(200):
            if caplog.records:
                break
            await asyncio.sleep(0.05)  # a poll for the first report, not a wait for a time
    (record,) = caplog.records[:1]
    assert record.getMessage().startswith(
        "model tiny: waiting for Triton: Triton at 127.0.0.1:1 is unavailable"
    )
    assert "Connection refused" in record.getMessage()


async def test_health_ready_says_why_a_model_is_not_ready(tiny_bpe_dir: Path) -> None:
    import httpx

    settings = Settings(models=[ServedModel(name="tiny", tokenizer=tiny_bpe_dir)], triton_url=["127.0.0.1:1"])
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        r = await client.get("/health/ready")
    assert r.status_code == 503
    body = r.json()
    assert body["models"] == {"tiny": False}
    assert body["reasons"]["tiny"].startswith("Triton at 127.0.0.1:1 is unavailable: ")
    assert "Connection refused" in body["reasons"]["tiny"]
