"""Adapters as models on every API (fake engine): listing with `parent`, `BASE:ADAPTER`, 404s in each
API's shape, the adapter on the engine request, and the admin endpoints' gates."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.lora import read_adapter
from tests.api.conftest import MakeClient
from tests.support.lora import write_numpy_adapter

ADMIN = {"Authorization": "Bearer admin-key"}


@pytest.fixture
def adapter(tmp_path: Path) -> Path:
    return write_numpy_adapter(tmp_path / "roots" / "a1")


async def test_an_adapter_is_a_model_with_its_parent_on_every_api(
    make_client: MakeClient, adapter: Path
) -> None:
    client, engine = await make_client(settings={"lora_modules": [f"my-adapter={adapter}"]})
    listed = (await client.get("/v1/models")).json()["data"]
    assert [(m["id"], m["parent"], m["root"]) for m in listed] == [
        ("tiny", None, "tiny"),
        ("my-adapter", "tiny", "tiny"),
    ]
    assert (await client.get("/v1/models/my-adapter")).json()["parent"] == "tiny"
    messages = [{"role": "user", "content": "Hi"}]
    for path, body in (
        ("/v1/chat/completions", {"messages": messages, "max_tokens": 3}),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 3}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 16}),
        ("/v1/messages", {"messages": messages, "max_tokens": 3}),
    ):
        for model in ("my-adapter", "tiny:my-adapter"):
            r = await client.post(path, json={"model": model, **body})
            assert r.status_code == 200 and r.json()["model"] == "my-adapter", (path, r.text)
            lora = engine.requests[-1].lora
            assert lora is not None and lora.name == "my-adapter"
            assert lora.task_id == read_adapter(adapter).task_id
        r = await client.post(path, json={"model": "other:my-adapter", **body})
        assert r.status_code == 404, path
        error = r.json()["error"]
        assert (
            error["type"] == "not_found_error"
            if path == "/v1/messages"
            else error["code"] == "model_not_found"
        )
    await client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
    assert engine.requests[-1].lora is None
    metrics = (await client.get("/metrics")).text
    counted = [line for line in metrics.splitlines() if line.startswith("gateway_requests_total{")]
    assert any('model="my-adapter"' in line and 'status="200"' in line for line in counted)


async def test_a_model_whose_route_takes_no_lora_refuses_its_adapters(
    make_client: MakeClient, adapter: Path
) -> None:
    client, _ = await make_client(settings={"lora_modules": [f"a={adapter}"]}, lora=False)
    r = await client.post("/v1/completions", json={"model": "a", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_not_supported"
    assert (
        await client.post("/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
    ).status_code == 200


async def test_a_corrupt_configured_adapter_is_a_400_and_nothing_else_is_affected(
    make_client: MakeClient, tmp_path: Path, adapter: Path
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4}')
    (bad / "adapter_model.safetensors").write_bytes(b"not safetensors")
    client, _ = await make_client(settings={"lora_modules": [f"bad={bad}", f"good={adapter}"]})
    r = await client.post(
        "/v1/messages", json={"model": "bad", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 400 and "not a readable safetensors file" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"
    for model in ("good", "tiny"):
        ok = await client.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200


async def test_dynamic_loading_is_off_by_default_and_admin_only(
    make_client: MakeClient, adapter: Path
) -> None:
    body = {"lora_name": "dyn", "lora_path": str(adapter)}
    client, _ = await make_client()
    assert (await client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)).status_code == 404
    roots = {
        "lora_dynamic_roots": [str(adapter.parent)],
        "admin_api_keys": ["admin-key"],
        "api_keys": ["user-key"],
    }
    client, engine = await make_client(settings=roots)
    user = {"Authorization": "Bearer user-key"}
    assert (await client.post("/v1/load_lora_adapter", json=body, headers=user)).status_code == 401
    assert (await client.post("/v1/load_lora_adapter", json=body)).status_code == 401
    r = await client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'dyn' added successfully."
    r = await client.post("/v1/load_lora_adapter", json=body, headers=ADMIN)
    assert r.status_code == 400 and "already been loaded" in r.json()["error"]["message"]
    assert (
        await client.post("/v1/load_lora_adapter", json={**body, "load_inplace": True}, headers=ADMIN)
    ).status_code == 200
    r = await client.post(
        "/v1/completions", json={"model": "dyn", "prompt": "Hi", "max_tokens": 2}, headers=user
    )
    assert r.status_code == 200 and engine.requests[-1].lora is not None
    assert (
        await client.post("/v1/unload_lora_adapter", json={"lora_name": "dyn"}, headers=ADMIN)
    ).status_code == 200
    r = await client.post(
        "/v1/completions", json={"model": "dyn", "prompt": "Hi", "max_tokens": 2}, headers=user
    )
    assert r.status_code == 404
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "dyn"}, headers=ADMIN)
    assert r.status_code == 404 and "cannot be found" in r.json()["error"]["message"]
