"""Images on every API over the fake engine (which declares that it takes images): the parts
arrive in prompt order as the engine request's images, and every hostile input is a 4xx in the
API's own error shape after which the gateway keeps serving. Servers run on 127.0.0.1 and
127.0.0.2 only; a refused one shows no request."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.core.models import ModelRegistry, ModelRuntime
from gateway.engine import ImageInput
from gateway.http.services import Services
from gateway.media import addresses, fetch
from gateway.text.tokenizer import Tokenizer
from tests.api.conftest import MakeClient
from tests.api.test_errors_api import assert_error
from tests.support.anthropic_errors import assert_error as assert_anthropic_error
from tests.support.images import ImageServer, data_uri, image_server, jpeg, png, png_bomb, truncated_png

# A Gemma-3-like chat template (an image part writes its placeholder) that also renders tool
# turns (Claude Code's tool_result images), over the tiny tokenizer.
TEMPLATE = (
    "{% for m in messages %}<turn>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
    "{% if p.type == 'image' %}<start_of_image>{% else %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<turn>model\n{% endif %}"
)
SOFT = " soft"
SOFT_TOKENS = 4


def expand(text: str, images: Sequence[ImageInput]) -> str:
    """Like Gemma 3's processor: each placeholder becomes its image's soft tokens and markers."""
    assert text.count("<start_of_image>") == len(images)
    block = "\n\n<start_of_image>" + SOFT * SOFT_TOKENS + "<end_of_image>\n\n"
    return text.replace("<start_of_image>", block)


def tokenizer_of(client: httpx.AsyncClient) -> Tokenizer:
    services: Services = client._transport.app.state.services  # type: ignore[attr-defined]
    return services.get(ModelRegistry).get("tiny").tokenizer


@pytest.fixture
def template_file(tmp_path: Path) -> Path:
    path = tmp_path / "vlm.jinja"
    path.write_text(TEMPLATE)
    return path


@pytest.fixture
def vlm(make_client: MakeClient, template_file: Path) -> Any:
    async def make(
        settings: dict[str, Any] | None = None, images: bool = True
    ) -> tuple[httpx.AsyncClient, Any]:
        client, engine = await make_client(
            settings=settings,
            model={"chat_template": template_file},
            images=images,
        )
        # The expansion the model's processor makes (what the serving side builds from the model).
        services: Services = client._transport.app.state.services  # type: ignore[attr-defined]
        registry = services.get(ModelRegistry)
        runtime = registry.get("tiny")
        registry._models["tiny"] = replace(runtime, expand_images=expand)
        return client, engine

    return make


@pytest.fixture
async def local() -> AsyncIterator[ImageServer]:
    async with image_server("127.0.0.1") as server:
        yield server


@pytest.fixture
async def private() -> AsyncIterator[ImageServer]:
    async with image_server("127.0.0.2") as server:
        yield server


@pytest.fixture
def public_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 plays a public host (127.0.0.2 and everything else keep the real policy)."""

    def policy(address: IPv4Address | IPv6Address, *, trusted: bool = False) -> str | None:
        return None if str(address) == "127.0.0.1" else addresses.refusal(address, trusted=trusted)

    monkeypatch.setattr(fetch, "refusal", policy)


def image_part(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def chat(*parts: dict[str, Any] | str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]
    return {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": content}], **extra}


async def still_serving(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json=chat("hello", image_part(data_uri(png()))))
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- chat completions


async def test_chat_images_reach_the_engine_in_prompt_order(vlm: Any) -> None:
    client, engine = await vlm()
    body = chat(
        "First", image_part(data_uri(png()), detail="low"), "then", image_part(data_uri(jpeg(), "image/jpeg"))
    )
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    request = engine.requests[0]
    assert [(i.mime_type, i.data) for i in request.images] == [("image/png", png()), ("image/jpeg", jpeg())]
    assert "First<start_of_image>then<start_of_image><end_of_turn>" in request.prompt_text
    # Usage counts the tokens the model reads: the template's prompt, each image expanded.
    expected = tokenizer_of(client).encode(expand(request.prompt_text, request.images))
    assert r.json()["usage"]["prompt_tokens"] == len(expected)


async def test_a_streamed_chat_with_an_image_is_answered(vlm: Any) -> None:
    client, engine = await vlm()
    body = chat(
        "What is it?", image_part(data_uri(png())), stream=True, stream_options={"include_usage": True}
    )
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.text.rstrip().endswith("data: [DONE]")
    assert len(engine.requests[0].images) == 1


async def test_an_allow_listed_local_server_is_fetched_and_answered(vlm: Any, local: ImageServer) -> None:
    client, engine = await vlm(settings={"allowed_media_domains": ["127.0.0.1"]})
    r = await client.post("/v1/chat/completions", json=chat("Describe", image_part(local.url("/image.jpg"))))
    assert r.status_code == 200, r.text
    assert local.requests == ["/image.jpg"]
    (image,) = engine.requests[0].images
    assert (image.mime_type, image.data, image.source) == ("image/jpeg", jpeg(), local.url("/image.jpg"))


async def test_a_loopback_url_is_refused_and_its_server_never_contacted(vlm: Any, local: ImageServer) -> None:
    client, engine = await vlm()
    r = await client.post("/v1/chat/completions", json=chat("Describe", image_part(local.url("/image.png"))))
    error = assert_error(r, 400, param="messages[0].content[1].image_url.url", code="image_url_not_allowed")
    assert "loopback" in error["message"]
    assert local.requests == []
    assert engine.requests == []
    await still_serving(client)


async def test_a_public_looking_url_redirecting_to_a_private_address_is_refused(
    vlm: Any, public_loopback: None, local: ImageServer, private: ImageServer
) -> None:
    client, _ = await vlm()
    url = f"{local.url('/redirect')}?to={private.url('/image.png')}"
    r = await client.post("/v1/chat/completions", json=chat(image_part(url)))
    assert_error(r, 400, param="messages[0].content[0].image_url.url", code="image_url_not_allowed")
    assert len(local.requests) == 1
    assert private.requests == []


HOSTILE = [
    ("file", lambda s: image_part("file:///etc/passwd"), 400, "invalid_image_url"),
    ("ftp", lambda s: image_part("ftp://example.com/a.png"), 400, "invalid_image_url"),
    ("corrupt", lambda s: image_part(data_uri(truncated_png())), 400, "invalid_image"),
    ("not an image", lambda s: image_part(data_uri(b"plain text, not pixels")), 400, "invalid_image"),
    ("bomb", lambda s: image_part(data_uri(png_bomb(30_000, 30_000))), 400, "image_too_large"),
    ("text/plain", lambda s: image_part(data_uri(png(), "text/plain")), 400, "unsupported_image_type"),
    (
        "metadata",
        lambda s: image_part("http://169.254.169.254/latest/meta-data/"),
        400,
        "image_url_not_allowed",
    ),
    (
        "ipv6 mapped",
        lambda s: image_part(f"http://[::ffff:127.0.0.1]:{s.port}/image.png"),
        400,
        "image_url_not_allowed",
    ),
    ("loopback", lambda s: image_part(s.url("/image.png")), 400, "image_url_not_allowed"),
]


@pytest.mark.parametrize(("name", "part", "status", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_images_are_4xx_and_the_gateway_keeps_serving(
    vlm: Any, local: ImageServer, name: str, part: Any, status: int, code: str
) -> None:
    client, engine = await vlm()
    r = await client.post("/v1/chat/completions", json=chat("look", part(local)))
    assert_error(r, status, param="messages[0].content[1].image_url.url", code=code)
    assert local.requests == []
    assert engine.requests == []
    await still_serving(client)


async def test_fifty_images_are_over_the_cap(vlm: Any, local: ImageServer) -> None:
    client, engine = await vlm(settings={"allowed_media_domains": ["127.0.0.1"]})
    parts = [image_part(local.url("/image.png")) for _ in range(50)]
    r = await client.post("/v1/chat/completions", json=chat("many", *parts))
    assert_error(r, 400, param="messages[0].content[17].image_url.url", code="too_many_images")
    assert local.requests == []
    assert engine.requests == []
    await still_serving(client)


async def test_a_30_mb_data_uri_is_refused(vlm: Any) -> None:
    client, _ = await vlm()
    uri = "data:image/png;base64," + base64.b64encode(b"\0" * (30 << 20)).decode()
    r = await client.post("/v1/chat/completions", json=chat("big", image_part(uri)))
    assert r.status_code == 413, r.text[:300]
    assert set(r.json()) == {"error"}
    await still_serving(client)


async def test_a_data_uri_over_the_image_cap_is_a_400(vlm: Any) -> None:
    client, _ = await vlm(settings={"max_image_bytes": 1000})
    r = await client.post(
        "/v1/chat/completions", json=chat("big", image_part(data_uri(png(300, 300, (1, 2, 3)) * 3)))
    )
    assert_error(r, 400, param="messages[0].content[1].image_url.url", code="image_too_large")


async def test_a_fetch_timeout_and_a_download_too_large_are_400s(
    vlm: Any, public_loopback: None, local: ImageServer
) -> None:
    client, _ = await vlm(settings={"media_read_timeout_s": 0.3, "max_image_bytes": 100_000})
    r = await client.post("/v1/chat/completions", json=chat(image_part(local.url("/hang"))))
    assert_error(r, 400, param="messages[0].content[0].image_url.url", code="image_fetch_timeout")
    r = await client.post("/v1/chat/completions", json=chat(image_part(local.url("/stream"))))
    assert_error(r, 400, param="messages[0].content[0].image_url.url", code="image_too_large")
    await still_serving(client)


async def test_fetching_can_be_turned_off(vlm: Any, local: ImageServer) -> None:
    client, _ = await vlm(settings={"media_url_fetch": False, "allowed_media_domains": ["127.0.0.1"]})
    r = await client.post("/v1/chat/completions", json=chat(image_part(local.url("/image.png"))))
    assert_error(r, 400, param="messages[0].content[0].image_url.url", code="image_url_not_allowed")
    assert local.requests == []


async def test_images_outside_user_messages_are_refused(vlm: Any) -> None:
    client, _ = await vlm()
    body = {
        "model": "tiny",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [image_part(data_uri(png()))]},
        ],
    }
    assert_error(await client.post("/v1/chat/completions", json=body), 400, param="messages[1].content[0]")


async def test_a_text_only_model_keeps_its_400_and_fetches_nothing(vlm: Any, local: ImageServer) -> None:
    client, _ = await vlm(images=False, settings={"allowed_media_domains": ["127.0.0.1"]})
    r = await client.post("/v1/chat/completions", json=chat("x", image_part(local.url("/image.png"))))
    error = assert_error(r, 400, param="messages[0].content[1].image_url.url", code="images_not_supported")
    assert "not supported by this model" in error["message"]
    r = await client.post(
        "/v1/responses",
        json={
            "model": "tiny",
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": local.url("/image.png")}]}
            ],
        },
    )
    assert_error(r, 400, param="input[0].content[0].image_url", code="images_not_supported")
    r = await client.post(
        "/v1/messages",
        json={
            "model": "tiny",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": local.url("/image.png")}}],
                }
            ],
        },
    )
    assert_anthropic_error(r, 400, "invalid_request_error", message="not supported by this model")
    assert local.requests == []


# ---------------------------------------------------------------- Responses


def responses_body(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"model": "tiny", "max_output_tokens": 16, "input": [{"role": "user", "content": list(parts)}]}


async def test_responses_input_images_reach_the_engine_in_order(vlm: Any) -> None:
    client, engine = await vlm()
    body = responses_body(
        {"type": "input_text", "text": "Compare"},
        {"type": "input_image", "image_url": data_uri(jpeg(), "image/jpeg"), "detail": "high"},
        {"type": "input_text", "text": "with"},
        {"type": "input_image", "image_url": data_uri(png())},
    )
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    request = engine.requests[0]
    assert [i.mime_type for i in request.images] == ["image/jpeg", "image/png"]
    assert "Compare<start_of_image>with<start_of_image>" in request.prompt_text


async def test_responses_file_id_is_a_400_naming_it(vlm: Any) -> None:
    client, _ = await vlm()
    r = await client.post(
        "/v1/responses", json=responses_body({"type": "input_image", "file_id": "file-abc"})
    )
    error = assert_error(r, 400, param="input[0].content[0].file_id")
    assert "file_id" in error["message"]


async def test_responses_hostile_image_is_a_400(vlm: Any, local: ImageServer) -> None:
    client, _ = await vlm()
    r = await client.post(
        "/v1/responses", json=responses_body({"type": "input_image", "image_url": local.url("/image.png")})
    )
    assert_error(r, 400, param="input[0].content[0].image_url", code="image_url_not_allowed")
    r = await client.post(
        "/v1/responses", json=responses_body({"type": "input_image", "image_url": "ftp://x/y.png"})
    )
    assert_error(r, 400, param="input[0].content[0].image_url", code="invalid_image_url")
    assert local.requests == []
    await still_serving(client)


async def test_responses_images_in_function_outputs_are_taken(vlm: Any) -> None:
    client, engine = await vlm()
    body = {
        "model": "tiny",
        "max_output_tokens": 16,
        "input": [
            {"role": "user", "content": "take a screenshot"},
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "here:"},
                    {"type": "input_image", "image_url": data_uri(png())},
                ],
            },
        ],
    }
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert len(engine.requests[0].images) == 1
    assert "here:<start_of_image>" in engine.requests[0].prompt_text


# ---------------------------------------------------------------- Messages


def b64_block(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": base64.b64encode(data).decode()},
    }


def messages_body(*blocks: dict[str, Any] | str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": b} if isinstance(b, str) else b for b in blocks]
    return {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": content}], **extra}


async def test_messages_base64_and_url_images_in_order(vlm: Any, local: ImageServer) -> None:
    client, engine = await vlm(settings={"allowed_media_domains": ["127.0.0.1"]})
    body = messages_body(
        b64_block(jpeg(), "image/jpeg"),
        "and",
        {"type": "image", "source": {"type": "url", "url": local.url("/image.png")}},
        "what differs?",
    )
    r = await client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    request = engine.requests[0]
    assert [(i.mime_type, i.source) for i in request.images] == [
        ("image/jpeg", "data"),
        ("image/png", local.url("/image.png")),
    ]
    assert "<start_of_image>and<start_of_image>what differs?" in request.prompt_text


async def test_messages_image_inside_a_tool_result(vlm: Any) -> None:
    client, engine = await vlm()
    body = {
        "model": "tiny",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "Read shot.png"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "shot.png"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [b64_block(png())]},
                    {"type": "text", "text": "What is in it?"},
                ],
            },
        ],
    }
    r = await client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    request = engine.requests[0]
    assert len(request.images) == 1
    assert "<turn>tool\n<start_of_image><end_of_turn>" in request.prompt_text


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b64_block(png(), "text/plain"), "not an allowed image type"),
        (b64_block(truncated_png()), "corrupt or truncated"),
        (b64_block(png_bomb(30_000, 30_000)), "pixels"),
        ({"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}, "http:// or https://"),
        ({"type": "image", "source": {"type": "file", "file_id": "file_1"}}, "`file` image sources"),
    ],
)
async def test_messages_hostile_images_are_anthropic_400s(
    vlm: Any, block: dict[str, Any], message: str
) -> None:
    client, engine = await vlm()
    r = await client.post("/v1/messages", json=messages_body("look", block))
    assert_anthropic_error(r, 400, "invalid_request_error", message=message)
    assert engine.requests == []
    await still_serving(client)


async def test_messages_refused_host_never_contacted(vlm: Any, local: ImageServer) -> None:
    client, _ = await vlm()
    block = {"type": "image", "source": {"type": "url", "url": local.url("/image.png")}}
    r = await client.post("/v1/messages", json=messages_body(block))
    assert_anthropic_error(r, 400, "invalid_request_error", message="loopback")
    assert local.requests == []


async def test_messages_30_mb_is_an_anthropic_413(vlm: Any) -> None:
    client, _ = await vlm()
    r = await client.post("/v1/messages", json=messages_body(b64_block(b"\0" * (30 << 20))))
    assert r.status_code == 413
    assert r.json()["type"] == "error"


# ---------------------------------------------------------------- counting


async def test_count_tokens_counts_images_as_the_model_reads_them(vlm: Any) -> None:
    client, _ = await vlm()
    plain = await client.post("/v1/messages/count_tokens", json=messages_body("look"))
    one = await client.post("/v1/messages/count_tokens", json=messages_body("look", b64_block(png())))
    two = await client.post(
        "/v1/messages/count_tokens",
        json=messages_body("look", b64_block(png()), b64_block(jpeg(), "image/jpeg")),
    )
    counts = [r.json()["input_tokens"] for r in (plain, one, two)]
    # Each image: <start_of_image>, its soft tokens, <end_of_image>, and the "\n\n" around them.
    tokenizer = tokenizer_of(client)
    soft = len(tokenizer.encode(SOFT * SOFT_TOKENS, add_special_tokens=False))
    assert counts[1] - counts[0] > soft
    assert counts[2] - counts[1] > soft


async def test_tokenize_counts_images_and_matches_chat_usage(vlm: Any) -> None:
    client, _ = await vlm()
    body = chat("look", image_part(data_uri(png())), "here")
    tokens = await client.post("/tokenize", json={"model": "tiny", "messages": body["messages"]})
    assert tokens.status_code == 200, tokens.text
    text = tokenizer_of(client).decode(tokens.json()["tokens"])
    assert text.count(SOFT) == SOFT_TOKENS
    usage = (await client.post("/v1/chat/completions", json=body)).json()["usage"]
    assert usage["prompt_tokens"] == tokens.json()["count"]


async def test_tokenize_refuses_hostile_images(vlm: Any, local: ImageServer) -> None:
    client, _ = await vlm()
    messages = chat(image_part(local.url("/image.png")))["messages"]
    r = await client.post("/tokenize", json={"model": "tiny", "messages": messages})
    assert r.status_code == 400
    assert local.requests == []


def test_runtime_default_counts_placeholders_only() -> None:
    assert ModelRuntime.__dataclass_fields__["expand_images"].default is None


# ---------------------------------------------------------------- the official clients


async def test_the_sdks_send_images_on_each_api(vlm: Any) -> None:
    import anthropic
    import openai

    client, engine = await vlm()
    http = httpx.AsyncClient(transport=client._transport)
    sdk = openai.AsyncOpenAI(
        base_url="http://gateway.test/v1", api_key="unused", http_client=http, max_retries=0
    )
    out = await sdk.chat.completions.create(
        model="tiny",
        max_tokens=5,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": data_uri(png()), "detail": "auto"}},
                ],
            }
        ],
    )
    assert out.choices[0].message.content
    stream = await sdk.chat.completions.create(
        model="tiny",
        max_tokens=5,
        stream=True,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": data_uri(jpeg(), "image/jpeg")}}],
            }
        ],
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    response = await sdk.responses.create(
        model="tiny",
        max_output_tokens=16,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe"},
                    {"type": "input_image", "image_url": data_uri(png()), "detail": "auto"},
                ],
            }
        ],
    )
    assert response.output_text
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(
            model="tiny",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}],
                }
            ],
        )
    assert info.value.body["param"] == "messages[0].content[0].image_url.url"  # type: ignore[index]
    import httpx2  # the anthropic SDK's HTTP client

    app = client._transport.app  # type: ignore[attr-defined]
    claude = anthropic.AsyncAnthropic(
        base_url="http://gateway.test",
        api_key="unused",
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)),
        max_retries=0,
    )
    message = await claude.messages.create(
        model="tiny",
        max_tokens=5,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/png",
                            "data": base64.b64encode(png()).decode(),
                        },
                    },
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ],
    )
    assert message.content
    with pytest.raises(anthropic.BadRequestError, match="not an allowed image type"):
        await claude.messages.create(
            model="tiny",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "text/plain", "data": "aGVsbG8="},  # type: ignore[typeddict-item]
                        }
                    ],
                }
            ],
        )
    assert [len(r.images) for r in engine.requests] == [1, 1, 1, 1]
    await claude.close()
    await sdk.close()


async def test_a_chat_template_that_ignores_images_is_a_400_not_a_silent_drop(
    make_client: MakeClient,
) -> None:
    # The tiny model's own template renders text parts only.
    client, engine = await make_client(images=True)
    r = await client.post("/v1/chat/completions", json=chat("look", image_part(data_uri(png()))))
    error = assert_error(r, 400, param="messages[0].content[1].image_url.url", code="images_not_rendered")
    assert "chat template" in error["message"]
    assert engine.requests == []
