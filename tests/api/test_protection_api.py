"""Keys, body limits, overload and deadlines: refused with OpenAI errors, nothing left running."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from tests.api.conftest import MakeClient
from tests.api.test_errors_api import assert_error
from tests.support.waiting import wait_until

USER = [{"role": "user", "content": "hi"}]
V1_ROUTES = [
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/tiny", None),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "x"}),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": USER}),
    ("GET", "/v1/unknown", None),
]


@pytest.mark.parametrize(("method", "path", "body"), V1_ROUTES)
async def test_wrong_or_missing_key_is_401_on_every_v1_route(
    make_client: MakeClient, method: str, path: str, body: dict | None
) -> None:
    client, engine = await make_client(settings={"api_keys": ["k-one", "k-two"]})
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "k-one"}):
        r = await client.request(method, path, json=body, headers=headers)
        assert_error(r, 401, param=None, code="invalid_api_key")
    assert engine.requests == []
    r = await client.request(method, path, json=body, headers={"Authorization": "Bearer k-two"})
    assert r.status_code != 401


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/rerank", {"model": "tiny", "query": "q", "documents": ["d"]}),
        ("/v2/rerank", {"model": "tiny", "query": "q", "documents": ["d"]}),
        ("/score", {"model": "tiny", "text_1": "q", "text_2": "d"}),
        ("/tokenize", {"model": "tiny", "prompt": "hello"}),
        ("/detokenize", {"model": "tiny", "tokens": [1, 2]}),
    ],
)
async def test_routes_outside_v1_ask_for_the_key_too(make_client: MakeClient, path: str, body: dict) -> None:
    """vLLM's paths beside /v1 serve models too: a key-protected gateway does not serve them
    without one."""
    client, _ = await make_client(settings={"api_keys": ["k-one"]})
    assert_error(await client.post(path, json=body), 401, param=None, code="invalid_api_key")
    r = await client.post(path, json=body, headers={"Authorization": "Bearer k-one"})
    assert r.status_code != 401


async def test_health_stays_open_and_metrics_can_be_protected(make_client: MakeClient, tmp_path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# ops\nfile-key\n")
    client, _ = await make_client(settings={"api_key_file": key_file, "protect_metrics": True})
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/health/ready")).status_code == 200
    assert_error(await client.get("/metrics"), 401, param=None)
    assert (await client.get("/metrics", headers={"Authorization": "Bearer file-key"})).status_code == 200


async def test_oversize_body_is_413(make_client: MakeClient) -> None:
    client, engine = await make_client(settings={"max_body_bytes": 2048})
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_error(await client.post("/v1/chat/completions", json=big), 413, param=None)

    async def chunked():
        yield json.dumps(big).encode()

    r = await client.post(
        "/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"}
    )
    assert_error(r, 413, param=None)
    assert engine.requests == []


async def test_overload_is_429_with_retry_after(make_client: MakeClient) -> None:
    gate = asyncio.Event()
    client, engine = await make_client(
        settings={"max_concurrent_requests": 1, "max_queued_requests": 1, "queue_timeout_s": 5}, gate=gate
    )
    metrics = client._transport.app.state.services.get(GatewayMetrics)  # type: ignore[attr-defined]
    body = {"model": "tiny", "messages": USER, "max_tokens": 3}
    first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await wait_until(lambda: bool(engine.active))
    queued = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await wait_until(lambda: "gateway_requests_queued 1.0" in generate_latest(metrics.registry).decode())
    r = await client.post("/v1/chat/completions", json=body)
    error = assert_error(r, 429, param=None, code="overloaded")
    assert error["type"] == "rate_limit_error"
    assert int(r.headers["retry-after"]) >= 1
    gate.set()
    assert (await first).status_code == 200
    assert (await queued).status_code == 200


async def test_a_queued_request_times_out_with_429(make_client: MakeClient) -> None:
    gate = asyncio.Event()
    client, engine = await make_client(
        settings={"max_concurrent_requests": 1, "max_queued_requests": 4, "queue_timeout_s": 0.05}, gate=gate
    )
    body = {"model": "tiny", "messages": USER, "max_tokens": 3}
    first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await wait_until(lambda: bool(engine.active))
    assert_error(await client.post("/v1/chat/completions", json=body), 429, param=None)
    gate.set()
    assert (await first).status_code == 200


async def test_deadline_is_504_and_cancels_the_engine_request(make_client: MakeClient) -> None:
    gate = asyncio.Event()  # never set: the engine would wait forever
    client, engine = await make_client(gate=gate)
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER},
        headers={"X-Request-Timeout": "0.05"},
    )
    assert_error(r, 504, param=None, code="timeout")
    assert engine.cancelled == [engine.requests[0].request_id] and not engine.active
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "stream": True},
        headers={"X-Request-Timeout": "0.05"},
    )
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "timeout"
    assert not engine.active


async def test_server_deadline_applies_without_a_header(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"request_timeout_s": 0.05}, gate=asyncio.Event())
    assert_error(await client.post("/v1/completions", json={"model": "tiny", "prompt": "x"}), 504, param=None)


async def test_bad_timeout_header_is_400(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "x"}, headers={"X-Request-Timeout": "soon"}
    )
    assert_error(r, 400, param="x-request-timeout")


async def test_cors_is_off_by_default_and_configurable(make_client: MakeClient) -> None:
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    client, _ = await make_client()
    r = await client.options("/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    client, _ = await make_client(settings={"cors_origins": ["https://app.example"]})
    r = await client.options("/v1/chat/completions", headers=preflight)
    assert r.headers["access-control-allow-origin"] == "https://app.example"


async def test_prompt_and_max_tokens_limits(make_client: MakeClient) -> None:
    client, engine = await make_client(settings={"max_prompt_tokens": 5, "max_tokens_limit": 10})
    assert_error(
        await client.post("/v1/completions", json={"model": "tiny", "prompt": "a b c d e f g h"}),
        400,
        param="prompt",
    )
    assert_error(
        await client.post("/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 11}),
        400,
        param="max_tokens",
    )
    r = await client.post("/v1/completions", json={"model": "tiny", "prompt": "a"})
    assert r.status_code == 200
    assert engine.requests[-1].params.max_tokens == 10
    # Chat names its own fields: the prompt is `messages`, the limit whichever field was sent.
    long = [{"role": "user", "content": "a b c d e f g h"}]
    for extra in ({}, {"max_tokens": 3}, {"max_completion_tokens": 3}):
        assert_error(
            await client.post("/v1/chat/completions", json={"model": "tiny", "messages": long, **extra}),
            400,
            param="messages",
        )
    # (The chat template alone is over 5 tokens: a client without the prompt limit.)
    client, _ = await make_client(settings={"max_tokens_limit": 10})
    short = [{"role": "user", "content": "a"}]
    for field in ("max_tokens", "max_completion_tokens"):
        assert_error(
            await client.post("/v1/chat/completions", json={"model": "tiny", "messages": short, field: 11}),
            400,
            param=field,
        )


@pytest.mark.parametrize(("header", "level"), [("0.05", logging.INFO), (None, logging.ERROR)])
async def test_a_deadline_the_client_chose_is_not_logged_as_a_server_error(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture, header: str | None, level: int
) -> None:
    client, _ = await make_client(
        settings={"request_timeout_s": 1.0 if header else 0.05}, gate=asyncio.Event()
    )
    caplog.set_level(logging.INFO, logger="gateway.core")
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "stream": True},
        headers={"X-Request-Timeout": header} if header else {},
    )
    assert '"code":"timeout"' in r.text
    (record,) = [rec for rec in caplog.records if rec.getMessage().startswith("stream failed")]
    assert record.levelno == level
    if header:
        assert "it asked for (X-Request-Timeout)" in record.getMessage()
