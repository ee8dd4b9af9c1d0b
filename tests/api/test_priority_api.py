"""Priority admission through the app: the most urgent waiter runs first, a full queue sheds its
least urgent waiter with a 429 and Retry-After in the API's own error shape, per-key defaults,
service tiers, metrics, and the priority handed to the engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from gateway.metrics import GatewayMetrics
from tests.api.conftest import MakeClient
from tests.api.test_errors_api import assert_error
from tests.support import anthropic_errors
from tests.support.fake_engine import FakeEngine
from tests.support.waiting import wait_until

USER = [{"role": "user", "content": "hi"}]
TIGHT = {"max_concurrent_requests": 1, "max_queued_requests": 1, "queue_timeout_s": 30}

# Each API's generation request, with the body fields that set its priority.
APIS: dict[str, tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "chat": ("/v1/chat/completions", lambda f: {"model": "tiny", "messages": USER, "max_tokens": 3, **f}),
    "completions": ("/v1/completions", lambda f: {"model": "tiny", "prompt": "hi", "max_tokens": 3, **f}),
    "responses": (
        "/v1/responses",
        lambda f: {"model": "tiny", "input": "hi", "max_output_tokens": 16, "store": False, **f},
    ),
    "messages": ("/v1/messages", lambda f: {"model": "tiny", "messages": USER, "max_tokens": 3, **f}),
}


def _metrics(client: httpx.AsyncClient) -> str:
    metrics = client._transport.app.state.services.get(GatewayMetrics)  # type: ignore[attr-defined]
    return generate_latest(metrics.registry).decode()


async def _queued(client: httpx.AsyncClient, count: int) -> None:
    await wait_until(lambda: f"gateway_requests_queued {count}.0" in _metrics(client))


async def _occupy(client: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict) -> asyncio.Task:
    """A request holding the only slot until the engine's gate opens."""
    task = asyncio.create_task(client.post(path, json=body))
    await wait_until(lambda: bool(engine.active))
    return task


@pytest.mark.parametrize("api", list(APIS))
async def test_a_more_urgent_request_displaces_the_least_urgent_waiter_with_a_429_in_the_apis_shape(
    make_client: MakeClient, api: str
) -> None:
    path, body = APIS[api]
    gate = asyncio.Event()
    client, engine = await make_client(settings=TIGHT, gate=gate)
    first = await _occupy(client, engine, path, body({}))
    low = asyncio.create_task(client.post(path, json=body({"priority": 5})))
    await _queued(client, 1)
    high = asyncio.create_task(client.post(path, json=body({"priority": -5})))
    shed = await low
    if api == "messages":
        anthropic_errors.assert_error(shed, 429, "rate_limit_error")
    else:
        error = assert_error(shed, 429, param=None, code="overloaded")
        assert error["type"] == "rate_limit_error"
    assert int(shed.headers["retry-after"]) >= 1
    assert not high.done()
    gate.set()
    assert (await first).status_code == 200
    assert (await high).status_code == 200
    # The engine saw the occupant and the urgent request, with its priority; never the shed one.
    assert [r.priority for r in engine.requests] == [0, -5]
    assert 'gateway_shed_requests_total{priority="5",reason="displaced"} 1.0' in _metrics(client)


@pytest.mark.parametrize("newcomer", [{"priority": 5}, {"priority": 9}, {}])
async def test_a_newcomer_no_more_urgent_than_the_full_queue_is_shed_and_the_waiter_keeps_its_place(
    make_client: MakeClient, newcomer: dict
) -> None:
    gate = asyncio.Event()
    client, engine = await make_client(settings=TIGHT, gate=gate)
    path, body = APIS["chat"]
    first = await _occupy(client, engine, path, body({}))
    waiter = asyncio.create_task(client.post(path, json=body({"priority": 0 if not newcomer else 5})))
    await _queued(client, 1)
    r = await client.post(path, json=body(newcomer))
    assert_error(r, 429, param=None, code="overloaded")
    assert "retry-after" in r.headers
    gate.set()
    assert (await first).status_code == 200
    assert (await waiter).status_code == 200
    assert len(engine.requests) == 2
    label = str(newcomer.get("priority", 0))
    assert f'gateway_shed_requests_total{{priority="{label}",reason="queue_full"}} 1.0' in _metrics(client)


async def test_a_freed_slot_goes_to_the_most_urgent_waiter_and_equals_go_in_arrival_order(
    make_client: MakeClient,
) -> None:
    gate = asyncio.Event()
    settings = {**TIGHT, "max_queued_requests": 8}
    client, engine = await make_client(settings=settings, gate=gate)
    path, body = APIS["chat"]
    first = await _occupy(client, engine, path, body({"user": "first"}))
    waiting = []
    arrivals = [("flex", {"service_tier": "flex"}), ("p3-a", {"priority": 3}), ("p-7", {"priority": -7})]
    arrivals += [("p3-b", {"priority": 3}), ("tier-priority", {"service_tier": "priority"}), ("plain", {})]
    for n, (name, fields) in enumerate(arrivals, 1):
        waiting.append(asyncio.create_task(client.post(path, json=body({"user": name, **fields}))))
        await _queued(client, n)
    gate.set()
    assert (await first).status_code == 200
    assert all(r.status_code == 200 for r in await asyncio.gather(*waiting))
    order = [r.affinity.removeprefix("user:") for r in engine.requests if r.affinity]
    assert order == ["first", "tier-priority", "p-7", "plain", "p3-a", "p3-b", "flex"]
    assert [r.priority for r in engine.requests] == [0, -10, -7, 0, 3, 3, 10]
    text = _metrics(client)
    assert 'gateway_admitted_requests_total{priority="3"} 2.0' in text
    assert 'gateway_queue_wait_seconds_count{priority="-10"} 1.0' in text


async def test_an_api_keys_default_priority_applies_unless_the_request_sets_one(
    make_client: MakeClient, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access")
    keys = tmp_path / "keys"
    keys.write_text("# batch jobs wait\nbatch-key priority=20\ninteractive-key priority=-2\nplain-key\n")
    client, engine = await make_client(settings={"api_key_file": keys})
    path, body = APIS["chat"]
    cases = [
        ("batch-key", {}, 20),
        ("batch-key", {"service_tier": "auto"}, 20),
        ("batch-key", {"service_tier": "default"}, 0),
        ("batch-key", {"priority": 1, "service_tier": "flex"}, 1),
        ("interactive-key", {}, -2),
        ("plain-key", {}, 0),
    ]
    for key, fields, _ in cases:
        r = await client.post(path, json=body(fields), headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
    mpath, mbody = APIS["messages"]
    for tier in ("auto", "standard_only"):
        r = await client.post(
            mpath, json=mbody({"service_tier": tier}), headers={"x-api-key": "interactive-key"}
        )
        assert r.status_code == 200, r.text
    assert [r.priority for r in engine.requests] == [c[2] for c in cases] + [-2, 0]
    logged = [rec.fields["priority"] for rec in caplog.records if rec.name == "gateway.access"]  # type: ignore[attr-defined]
    assert logged == [c[2] for c in cases] + [-2, 0]


@pytest.mark.parametrize(
    ("api", "fields", "param"),
    [
        ("chat", {"service_tier": "express"}, "service_tier"),
        ("chat", {"priority": "high"}, "priority"),
        ("completions", {"priority": 2**31}, "priority"),
        ("responses", {"service_tier": "gold"}, "service_tier"),
    ],
)
async def test_a_bad_priority_or_service_tier_is_a_400_naming_it(
    make_client: MakeClient, api: str, fields: dict, param: str
) -> None:
    client, engine = await make_client()
    path, body = APIS[api]
    r = await client.post(path, json=body(fields))
    assert r.status_code == 400, r.text
    assert param in r.json()["error"]["message"] or r.json()["error"]["param"] == param
    assert engine.requests == []


async def test_a_bad_request_is_a_400_even_when_every_slot_and_the_queue_are_taken(
    make_client: MakeClient,
) -> None:
    # Admission waits until the body is parsed and valid: bad input is told so, not to retry.
    gate = asyncio.Event()
    client, engine = await make_client(settings={**TIGHT, "max_queued_requests": 0}, gate=gate)
    path, body = APIS["chat"]
    first = await _occupy(client, engine, path, body({}))
    for _ in range(3):
        assert_error(await client.post(path, json=body({"temperature": 9})), 400, param="temperature")
    assert_error(await client.post(path, json=body({})), 429, param=None, code="overloaded")
    gate.set()
    assert (await first).status_code == 200
    assert (await client.post(path, json=body({}))).status_code == 200
