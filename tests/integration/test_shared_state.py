"""Two gateway processes in front of the real CPU Triton share one redis-server (`--state-url`):
one key's request limit (the second gateway sees what the first used) and one stored
conversation (created through one, retrieved and continued through the other)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import TritonStack
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.integration

KEY = "bpe_synthetic"
LIMITED = "sk-limited"
OPEN = "sk-open"


@pytest.fixture(scope="module")
def gateways(triton_stack: TritonStack, redis_server: RedisServer) -> Iterator[list[GatewayProcess]]:
    redis_server.flush()
    model = triton_stack.models[KEY]
    spec = (
        f"name=tiny,tokenizer={model.tokenizer_dir},triton_model={model.ensemble},engine_model={model.engine}"
    )
    args = ["--triton-url", triton_stack.grpc_url, "--model", spec, "--log-level", "warning"]
    args += ["--state-url", redis_server.url, "--api-keys", LIMITED, "--api-keys", OPEN]
    args += ["--key-rate-limit", f"key={LIMITED},rpm=3"]
    first, second = GatewayProcess(args), GatewayProcess(args)
    try:
        yield [first.start(), second.start()]
    finally:
        first.stop()
        second.stop()


def _client(process: GatewayProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=process.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_two_gateways_share_one_keys_request_limit(gateways: list[GatewayProcess]) -> None:
    a, b = (_client(g, LIMITED) for g in gateways)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    remaining = []
    for client in (a, b, a):
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        remaining.append(r.headers["x-ratelimit-remaining-requests"])
    # Each gateway saw the other's requests: one bucket of 3 for the key.
    assert remaining == ["2", "1", "0"]
    refused = b.post("/v1/chat/completions", json=body)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    message = b.post("/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": body["messages"]})
    assert message.status_code == 429 and message.json()["error"]["type"] == "rate_limit_error"
    # Another key is not limited (no default limit).
    other = _client(gateways[1], OPEN).post("/v1/chat/completions", json=body)
    assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers


def test_a_conversation_stored_through_one_gateway_continues_through_the_other(
    gateways: list[GatewayProcess],
) -> None:
    a, b = (_client(g, OPEN) for g in gateways)
    first = a.post(
        "/v1/responses", json={"model": "tiny", "input": "my name is Ada", "max_output_tokens": 16}
    )
    assert first.status_code == 200, first.text
    stored = first.json()
    got = b.get(f"/v1/responses/{stored['id']}")
    assert got.status_code == 200 and got.json()["output"] == stored["output"]
    second = b.post(
        "/v1/responses",
        json={
            "model": "tiny",
            "input": "what is my name?",
            "previous_response_id": stored["id"],
            "max_output_tokens": 16,
        },
    )
    assert second.status_code == 200, second.text
    body = second.json()
    assert body["previous_response_id"] == stored["id"]
    # The continued prompt held the first turn: its token count is larger than the new turn alone.
    alone = b.post(
        "/v1/responses", json={"model": "tiny", "input": "what is my name?", "max_output_tokens": 16}
    )
    assert body["usage"]["input_tokens"] > alone.json()["usage"]["input_tokens"]
    items = a.get(f"/v1/responses/{body['id']}/input_items", params={"order": "asc"}).json()["data"]
    texts = [part["text"] for item in items if item["type"] == "message" for part in item["content"]]
    assert texts[0] == "my name is Ada" and texts[-1] == "what is my name?"
