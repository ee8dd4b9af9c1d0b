"""Property-based fuzzing of the HTTP API: whatever arrives, no 5xx, and every error is in its API's shape;
for a model on an engine that can do everything and one like the llmapi model, which lacks much."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import ServedModel, Settings
from tests.support.anthropic_errors import validate_error
from tests.support.fake_engine import LLMAPI_LIKE, FakeEngine
from tests.support.fixtures import build_tiny
from tests.support.openai_schema import validate
from tests.support.tokenizers import loaded_tokenizer


def _app() -> Any:
    model_dir = build_tiny("bpe")
    config = Settings(
        models=[
            ServedModel(name="tiny", tokenizer=model_dir, max_model_len=256),
            # An engine like the llmapi model: what it lacks is refused, never a 5xx.
            ServedModel(name="tiny-llmapi", tokenizer=model_dir, max_model_len=256, tool_parser="hermes"),
        ]
    )

    def engine(m: ServedModel) -> FakeEngine:
        # Short replies keep thousands of fuzzed requests fast.
        like = LLMAPI_LIKE if m.name == "tiny-llmapi" else {}
        return FakeEngine(loaded_tokenizer(m.tokenizer), reply=lambda r, i: "ok.", **like)

    return create_app(config, engine_factory=engine)


APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


def check_response(status: int, body: bytes, content_type: str, path: str = "/v1/chat/completions") -> None:
    assert status < 500, body[:500]
    if status >= 400:
        payload = json.loads(body)
        if path.startswith("/v1/messages"):
            validate_error(payload)
        else:
            validate("ErrorResponse", payload)


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(APP) as c:
        yield c


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_schemathesis_finds_no_server_errors(case: schemathesis.Case, client: TestClient) -> None:
    response = case.call(session=client)
    check_response(
        response.status_code, response.content, response.headers.get("content-type", ""), case.path
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "echo",
    "top_k",
    "min_tokens",
    "repetition_penalty",
    "ignore_eos",
    "logprobs",
    "user",
    "tools",
    "tool_choice",
    "response_format",
    "logit_bias",
]
valid_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "developer"]),
        "content": st.text(max_size=30),
    }
)
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["tiny", "tiny-llmapi", "other"])},
    optional={
        **{f: json_values for f in FIELDS if f != "model"},
        "messages": st.lists(valid_message, max_size=3) | json_values,
        "prompt": st.text(max_size=30) | st.lists(st.integers(-5, 700), max_size=5) | json_values,
        "max_tokens": st.integers(-3, 300),
        "stream": st.booleans(),
        "stop": st.text(max_size=5) | st.lists(st.text(max_size=3), max_size=5),
    },
)


# As many examples per served model as with one model served.
@settings(max_examples=225, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_arbitrary_request_bodies_never_cause_a_server_error(
    client: TestClient, body: dict, path: str
) -> None:
    r = client.post(path, json=body)
    check_response(r.status_code, r.content, r.headers.get("content-type", ""))
    if r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n")


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_are_a_400_not_a_crash(client: TestClient, raw: bytes) -> None:
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    check_response(r.status_code, r.content, r.headers.get("content-type", ""))


def test_the_openapi_document_lists_the_openai_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{model}"} <= set(paths)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("field", ["temperature", "length_penalty", "top_p", "max_tokens", "seed"])
def test_non_finite_numbers_are_rejected(client: TestClient, field: str, value: str) -> None:
    head = '{"model": "tiny", "messages": [{"role": "user", "content": "x"}]'
    raw = f'{head}, "{field}": {value}}}'
    r = client.post(
        "/v1/chat/completions", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
