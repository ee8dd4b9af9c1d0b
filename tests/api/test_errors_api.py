"""Bad input always gets an OpenAI-shaped error with the right status, never a 500."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import EngineUnavailableError
from gateway.logs import TextFormatter
from tests.api.conftest import MakeClient
from tests.support.openai_schema import validate

USER = [{"role": "user", "content": "hi"}]


def assert_error(r, status: int, *, param: str | None, code: str | None = ...) -> dict:  # type: ignore[assignment]
    """An OpenAI error body with this status, naming `param` (every error case says which, None
    included)."""
    assert r.status_code == status, r.text
    body = r.json()
    validate("ErrorResponse", body)
    assert set(body) == {"error"}
    assert body["error"]["param"] == param
    if code is not ...:
        assert body["error"]["code"] == code
    assert "Traceback" not in r.text
    return body["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "messages": USER, "max_tokens": -1}, "max_tokens"),
        ({"model": "tiny", "messages": USER, "max_tokens": "ten"}, "max_tokens"),
        ({"model": "tiny", "messages": USER, "temperature": 2.5}, "temperature"),
        ({"model": "tiny", "messages": USER, "top_p": -0.1}, "top_p"),
        ({"model": "tiny", "messages": USER, "n": 0}, "n"),
        ({"model": "tiny", "messages": USER, "presence_penalty": 3}, "presence_penalty"),
        ({"model": "tiny"}, "messages"),
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": "hello"}, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": USER}, "model"),
        ({"model": "tiny", "messages": USER, "stop": 5}, "stop"),
        ({"model": "tiny", "messages": USER, "stream": "yes please"}, "stream"),
        ({"model": "tiny", "messages": USER, "top_k": 2**31}, "top_k"),
    ],
)
async def test_invalid_chat_fields_are_400_naming_the_param(
    make_client: MakeClient, body: dict, param: str
) -> None:
    client, engine = await make_client()
    error = assert_error(await client.post("/v1/chat/completions", json=body), 400, param=param)
    assert error["type"] == "invalid_request_error"
    assert engine.requests == []


async def test_malformed_json_is_400(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post(
        "/v1/chat/completions",
        content=b'{"model": "tiny", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert_error(r, 400, param=None)
    r = await client.post("/v1/chat/completions", content=b"", headers={"content-type": "application/json"})
    assert_error(r, 400, param=None)
    r = await client.post("/v1/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert_error(r, 400, param=None)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_400_saying_so(
    make_client: MakeClient, content_type: str | None
) -> None:
    client, engine = await make_client()
    body = b'{"model": "tiny", "prompt": "hi", "max_tokens": 2}'
    headers = {"content-type": content_type} if content_type else {}
    if content_type is None:
        # httpx sends no content type for raw bytes.
        assert "content-type" not in client.build_request("POST", "/v1/completions", content=body).headers
    error = assert_error(await client.post("/v1/completions", content=body, headers=headers), 400, param=None)
    assert "Content-Type: application/json" in error["message"]
    assert engine.requests == []
    # A JSON subtype with parameters is JSON.
    ok = await client.post(
        "/v1/completions", content=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 200, ok.text


async def test_unknown_model_is_404_model_not_found(make_client: MakeClient) -> None:
    client, _ = await make_client()
    error = assert_error(
        await client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER}),
        404,
        param="model",
        code="model_not_found",
    )
    assert "gpt-9" in error["message"]
    # What to use instead: the served names.
    assert error["message"].endswith("This server serves `tiny`.")
    error = assert_error(await client.get("/v1/models/gpt-9"), 404, param="model", code="model_not_found")
    assert error["message"].endswith("This server serves `tiny`.")


async def test_the_access_line_of_an_error_names_its_type_and_code(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = await make_client()
    caplog.set_level(logging.INFO, logger="gateway.access")
    await client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER})
    await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": -1})
    await client.post("/v1/chat/completion", json={})
    await client.post("/v1/messages", json={"model": "gpt-9", "max_tokens": 5, "messages": USER})
    await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "max_tokens": 2})
    lines = [rec for rec in caplog.records if rec.name == "gateway.access"]
    assert [(rec.fields["status"], rec.fields["error"]) for rec in lines] == [  # type: ignore[attr-defined]
        (404, "invalid_request_error/model_not_found"),
        (400, "invalid_request_error"),
        (404, "invalid_request_error"),
        (404, "not_found_error/model_not_found"),
        (200, None),
    ]
    # The text line shows it: `... status=404 error=invalid_request_error/model_not_found ...`.
    assert "error=invalid_request_error/model_not_found" in TextFormatter().format(lines[0])
    # A refusal before any route (a missing API key) too.
    caplog.clear()
    locked, _ = await make_client(settings={"api_keys": ["sk-right"]})
    assert (
        await locked.post("/v1/chat/completions", json={"model": "tiny", "messages": USER})
    ).status_code == 401
    (line,) = [rec for rec in caplog.records if rec.name == "gateway.access"]
    assert line.fields["error"] == "invalid_request_error/invalid_api_key"  # type: ignore[attr-defined]


async def test_over_long_prompt_is_context_length_exceeded_naming_messages_or_prompt(
    make_client: MakeClient,
) -> None:
    # OpenAI names the field that holds the prompt: `messages` for chat, whichever max-tokens
    # field the request used.
    client, _ = await make_client()
    long = [{"role": "user", "content": "word " * 2000}]
    for extra in ({}, {"max_tokens": 5}, {"max_completion_tokens": 5}):
        assert_error(
            await client.post("/v1/chat/completions", json={"model": "tiny", "messages": long, **extra}),
            400,
            param="messages",
            code="context_length_exceeded",
        )
    for field in ("max_tokens", "max_completion_tokens"):
        assert_error(
            await client.post(
                "/v1/chat/completions", json={"model": "tiny", "messages": USER, field: 100000}
            ),
            400,
            param="messages",
            code="context_length_exceeded",
        )
    for extra in ({}, {"max_tokens": 5}):
        assert_error(
            await client.post("/v1/completions", json={"model": "tiny", "prompt": "word " * 2000, **extra}),
            400,
            param="prompt",
            code="context_length_exceeded",
        )
    assert_error(
        await client.post("/v1/completions", json={"model": "tiny", "prompt": [5] * 5000}),
        400,
        param="prompt",
        code="context_length_exceeded",
    )
    # Anthropic's max_tokens only caps the completion: the prompt alone is what does not fit,
    # and the message says so rather than counting a completion length nobody asked for.
    r = await client.post("/v1/messages", json={"model": "tiny", "messages": long, "max_tokens": 12})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "leaves no room for the completion" in message and "you requested" not in message, message


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"logit_bias": {"5": 10}}, "logit_bias"),  # engine without embedding_bias
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
    ],
)
async def test_fields_that_change_the_result_but_are_unsupported_are_rejected_by_name(
    make_client: MakeClient, path: str, extra: dict, param: str
) -> None:
    client, engine = await make_client(logit_bias=False)
    body = {"model": "tiny", **({"messages": USER} if "chat" in path else {"prompt": "x"})}
    r = await client.post(path, json={**body, **extra})
    assert_error(r, 400, param=param, code="unsupported_parameter")
    assert engine.requests == []


async def test_unknown_fields_are_accepted(make_client: MakeClient) -> None:
    client, _ = await make_client()
    r = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": USER, "store": True, "metadata": {"a": "b"}},
    )
    assert r.status_code == 200


async def test_image_parts_on_a_text_only_model_are_400_naming_the_part(make_client: MakeClient) -> None:
    client, _ = await make_client()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert_error(r, 400, param="messages[0].content[0].image_url.url")
    assert "content parts of type `image_url` are not supported by this model" in r.json()["error"]["message"]


async def test_too_many_or_too_long_stop_strings_are_400(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"max_stop_strings": 2, "max_stop_string_length": 5})
    r = await client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": USER, "stop": ["a", "b", "c"]}
    )
    assert_error(r, 400, param="stop")
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "stop": "toolong"})
    assert_error(r, 400, param="stop")


async def test_n_above_the_limit_is_400(make_client: MakeClient) -> None:
    client, _ = await make_client(settings={"max_n": 4})
    assert_error(
        await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER, "n": 5}),
        400,
        param="n",
    )


async def test_engine_unavailable_is_503_before_the_stream_starts(make_client: MakeClient) -> None:
    client, _ = await make_client(ready=False)
    for stream in (False, True):
        r = await client.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": USER, "stream": stream}
        )
        assert_error(r, 503, param=None, code="engine_unavailable")
    r = await client.get("/health/ready")
    assert r.status_code == 503
    assert (await client.get("/health")).status_code == 200


async def test_engine_unavailable_mid_request_is_503(make_client: MakeClient) -> None:
    client, _ = await make_client(fail_after=0, fail_with=EngineUnavailableError)
    assert_error(
        await client.post("/v1/chat/completions", json={"model": "tiny", "messages": USER}), 503, param=None
    )


async def test_unknown_route_and_wrong_method_are_openai_shaped(make_client: MakeClient) -> None:
    client, _ = await make_client()
    assert_error(await client.get("/v1/nothing-here"), 404, param=None)
    assert_error(await client.get("/v1/chat/completions"), 405, param=None)


async def test_token_ids_outside_the_vocabulary_are_400(make_client: MakeClient) -> None:
    client, _ = await make_client()
    assert_error(
        await client.post("/v1/completions", json={"model": "tiny", "prompt": [1, 999999]}),
        400,
        param="prompt",
    )
    assert_error(
        await client.post("/v1/completions", json={"model": "tiny", "prompt": ""}), 400, param="prompt"
    )
    assert_error(
        await client.post("/v1/completions", json={"model": "tiny", "prompt": []}), 400, param="prompt"
    )


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_lone_surrogate_in_the_json_is_a_400_not_a_500(make_client: MakeClient, path: str) -> None:
    # JSON may escape half a UTF-16 pair; no tokenizer can take the Python string it makes.
    client, engine = await make_client()
    text = '"hi \\ud800 there"'
    body = (
        f'{{"model": "tiny", "prompt": {text}}}'
        if path == "/v1/completions"
        else f'{{"model": "tiny", "messages": [{{"role": "user", "content": {text}}}]}}'
    )
    r = await client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    # The JSON parser refuses it, before any field is read: no field to name.
    assert_error(r, 400, param=None)
    assert engine.requests == []


async def test_other_methods_on_the_generation_routes_are_405(make_client: MakeClient) -> None:
    client, _ = await make_client()
    assert_error(await client.get("/v1/completions"), 405, param=None)
    assert_error(await client.put("/v1/chat/completions", json={}), 405, param=None)
