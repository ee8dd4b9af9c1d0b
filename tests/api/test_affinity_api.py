"""What keeps a conversation on one engine replica under prefix routing, on every chat-shaped API:
the client's cache key, then the X-Session-Id header, then the end user."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import MakeClient

USER = [{"role": "user", "content": "Say hello"}]
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "tiny", "messages": USER, "max_tokens": 4},
    "/v1/responses": {"model": "tiny", "input": "Say hello", "max_output_tokens": 16, "store": False},
    "/v1/messages": {"model": "tiny", "messages": USER, "max_tokens": 4},
}


@pytest.mark.parametrize(
    ("path", "fields", "headers", "expected"),
    [
        ("/v1/chat/completions", {"prompt_cache_key": "k", "user": "u"}, {"X-Session-Id": "s"}, "cache:k"),
        ("/v1/chat/completions", {"user": "u"}, {"X-Session-Id": "s"}, "session:s"),
        ("/v1/responses", {"prompt_cache_key": "conv-1", "safety_identifier": "u"}, {}, "cache:conv-1"),
        ("/v1/responses", {"safety_identifier": "u"}, {"X-Session-Id": "s"}, "session:s"),
        ("/v1/responses", {"user": "u"}, {}, "user:u"),
        ("/v1/messages", {"metadata": {"user_id": "claude-session"}}, {}, "user:claude-session"),
        ("/v1/messages", {"metadata": {"user_id": "u"}}, {"X-Session-Id": "s"}, "session:s"),
        ("/v1/messages", {}, {}, None),
    ],
)
async def test_the_affinity_key_reaches_the_engine_request(
    make_client: MakeClient, path: str, fields: dict[str, Any], headers: dict[str, str], expected: str | None
) -> None:
    client, engine = await make_client()
    r = await client.post(path, json={**BODIES[path], **fields}, headers=headers)
    assert r.status_code == 200, r.text
    assert engine.requests[-1].affinity == expected
