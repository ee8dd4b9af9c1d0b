"""HTTP details probes and clients rely on: HEAD where GET is served, Allow on every 405, a clear
404 for a model URL that names no model, and for a path no route serves the route it most likely
meant or the base-URL fix."""

from __future__ import annotations

import pytest

from tests.api.conftest import MakeClient
from tests.support.openai_schema import validate


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


@pytest.mark.parametrize(
    ("method", "path", "advice"),
    [
        ("POST", "/v1/chat/completion", "Did you mean POST /v1/chat/completions?"),
        ("POST", "/v1/response", "Did you mean POST /v1/responses?"),
        ("GET", "/v1/model/tiny", "Did you mean GET /v1/models/tiny?"),
        ("GET", "/healthz", "Did you mean GET /health?"),
        (
            "POST",
            "/v1/v1/chat/completions",
            "The path has /v1 twice: remove one /v1 from the client's base URL "
            "(did you mean POST /v1/chat/completions?).",
        ),
        (
            "POST",
            "/chat/completions",
            "The path lacks /v1: add /v1 to the client's base URL (did you mean POST /v1/chat/completions?).",
        ),
        (
            "GET",
            "/models",
            "The path lacks /v1: add /v1 to the client's base URL (did you mean GET /v1/models?).",
        ),
    ],
)
async def test_an_unknown_path_is_a_404_naming_the_route_or_the_base_url_fix(
    make_client: MakeClient, method: str, path: str, advice: str
) -> None:
    client, _ = await make_client()
    r = await client.request(method, path, json={"model": "tiny"})
    assert r.status_code == 404, r.text
    validate("ErrorResponse", r.json())
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"Unknown request URL: {method} {path}. {advice}"


async def test_a_path_near_no_route_is_a_plain_404(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post("/v1/audio/speech", json={})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "Unknown request URL: POST /v1/audio/speech."


async def test_an_anthropic_base_url_ending_in_v1_gets_anthropics_404_with_the_fix(
    make_client: MakeClient,
) -> None:
    # The Anthropic SDK and Claude Code add /v1/messages to the base URL themselves.
    client, _ = await make_client()
    r = await client.post("/v1/v1/messages", json={})
    assert r.status_code == 404
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body
    assert "remove one /v1 from the client's base URL" in body["error"]["message"]
    assert "did you mean POST /v1/messages?" in body["error"]["message"]
