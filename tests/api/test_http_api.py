"""HTTP details probes and clients rely on: HEAD where GET is served, Allow on every 405, and a
clear 404 for a model URL that names no model."""

from __future__ import annotations

import pytest

from tests.api.conftest import MakeClient


@pytest.mark.parametrize("path", ["/health", "/health/ready", "/v1/models", "/metrics"])
async def test_head_is_served_wherever_get_is_for_probes(make_client: MakeClient, path: str) -> None:
    client, _ = await make_client()
    get = await client.get(path)
    head = await client.head(path)
    assert (get.status_code, head.status_code) == (200, 200)
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/v1/models", "GET, HEAD"),
        ("DELETE", "/health", "GET, HEAD"),
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/v1/models/tiny", "GET"),
    ],
)
async def test_a_405_says_which_methods_are_allowed(
    make_client: MakeClient, method: str, path: str, allow: str
) -> None:
    client, _ = await make_client()
    r = await client.request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].endswith(f"use {allow}.")


async def test_a_model_url_with_an_empty_id_is_a_404_pointing_at_the_list(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.get("/v1/models/")
    assert r.status_code == 404
    message = r.json()["error"]["message"]
    assert "names no model" in message and "GET /v1/models" in message and "``" not in message


async def test_the_openapi_document_keeps_to_openais_operations(make_client: MakeClient) -> None:
    client, _ = await make_client()
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert set(paths["/v1/models"]) == {"get"}
