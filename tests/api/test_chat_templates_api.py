"""Chat templates as the families write them: their own errors as 400s, transformers' helpers,
tools refused where the template cannot show them to the model, and earlier calls and results
shown as text where it has no tool turn."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deploy.families import build_family_model
from tests.api.conftest import MakeClient
from tests.support.anthropic_errors import assert_error as assert_anthropic_error
from tests.support.openai_schema import validate

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
HELPERS = """\
{%- if messages | length > 2 %}
    {{- raise_exception('Only one turn, please: got ' ~ messages | length) }}
{%- endif %}
{{- strftime_now('%Y') + '|' + (messages[0] | tojson(indent=2, sort_keys=True)) + '|' }}
{{- messages[0]['content'] | tojson }}"""


@pytest.fixture
def helpers_template(tmp_path: Path) -> Path:
    path = tmp_path / "helpers.jinja"
    path.write_text(HELPERS, encoding="utf-8")
    return path


async def test_transformers_template_helpers_are_there(
    make_client: MakeClient, helpers_template: Path
) -> None:
    client, engine = await make_client(model={"chat_template": str(helpers_template)})
    message = {"role": "user", "content": "café 🙂"}
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": [message]})
    assert r.status_code == 200, r.text
    year = time.strftime("%Y")
    # tojson with its arguments, and without escaping non-ASCII text (transformers' filter).
    assert engine.requests[0].prompt_text == (
        f"{year}|{json.dumps(message, indent=2, sort_keys=True, ensure_ascii=False)}|"
        + json.dumps("café 🙂", ensure_ascii=False)
    )


async def test_raise_exception_is_a_400_with_the_templates_message(
    make_client: MakeClient, helpers_template: Path
) -> None:
    client, _ = await make_client(model={"chat_template": str(helpers_template)})
    turns = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": turns})
    assert r.status_code == 400
    validate("ErrorResponse", r.json())
    assert "Only one turn, please: got 3" in r.json()["error"]["message"]
    r = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": turns})
    assert_anthropic_error(r, 400, "invalid_request_error")
    assert "Only one turn, please: got 3" in r.json()["error"]["message"]
    r = await client.post("/v1/responses", json={"model": "tiny", "input": turns})
    assert r.status_code == 400 and "Only one turn, please: got 3" in r.json()["error"]["message"]


async def test_a_family_templates_own_rule_is_a_400(make_client: MakeClient) -> None:
    client, _ = await make_client(tokenizer_dir=build_family_model("gemma3"))
    turns = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": turns})
    assert r.status_code == 400
    assert "Conversation roles must alternate user/assistant/user/assistant" in r.json()["error"]["message"]


async def test_tools_for_a_template_that_cannot_render_them_are_a_400(make_client: MakeClient) -> None:
    # Llama 3's template (the package's) renders no tools; the tiny model's does.
    client, _ = await make_client(
        tokenizer_dir=build_family_model("llama3_1"), model={"tool_parser": "hermes"}
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "tools" and "does not render tools" in error["message"]
    r = await client.post("/v1/chat/completions", json={**body, "tools": None})
    assert r.status_code == 200
    tiny, _ = await make_client(model={"tool_parser": "hermes"})
    assert (await tiny.post("/v1/chat/completions", json=body)).status_code == 200


CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("family", ["llama3_1", "gemma3", "llama2", "deepseek_v3"])
@pytest.mark.parametrize("tool_choice", ["required", NAMED])
async def test_a_forced_tool_choice_is_served_on_a_template_that_renders_no_tools(
    make_client: MakeClient, family: str, tool_choice: Any
) -> None:
    # These packaged templates render no tools: the guide's schema makes the reply a call.
    client, engine = await make_client(tokenizer_dir=build_family_model(family), reply=lambda req, i: CALL)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": TOOLS,
        "tool_choice": tool_choice,
    }
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    validate("CreateChatCompletionResponse", r.json())
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    guide_type, guide = engine.requests[0].guide  # type: ignore[misc]
    assert guide_type == "json_schema" and "get_weather" in guide
    # auto is still refused: the model would never know the tool exists.
    r = await client.post("/v1/chat/completions", json={**body, "tool_choice": "auto"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


@pytest.mark.parametrize("family", ["gemma3", "llama2", "deepseek_v3"])
async def test_a_forced_tool_choice_on_such_a_template_works_on_messages_and_responses(
    make_client: MakeClient, family: str
) -> None:
    client, _ = await make_client(tokenizer_dir=build_family_model(family), reply=lambda req, i: CALL)
    user = [{"role": "user", "content": "weather?"}]
    anthropic_tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        r = await client.post(
            "/v1/messages",
            json={
                "model": "tiny",
                "max_tokens": 32,
                "messages": user,
                "tools": [anthropic_tool],
                "tool_choice": choice,
            },
        )
        assert r.status_code == 200, r.text
        (block,) = [b for b in r.json()["content"] if b["type"] == "tool_use"]
        assert block["name"] == "get_weather" and block["input"] == {"city": "Paris"}
        assert r.json()["stop_reason"] == "tool_use"
    responses_tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = await client.post(
            "/v1/responses",
            json={"model": "tiny", "input": "weather?", "tools": [responses_tool], "tool_choice": choice},
        )
        assert r.status_code == 200, r.text
        (call,) = [item for item in r.json()["output"] if item["type"] == "function_call"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}


async def test_a_tool_conversation_on_gemma_3s_template_is_served_on_every_api(
    make_client: MakeClient,
) -> None:
    """Gemma 3's template refuses a `tool` turn and never reads `tool_calls`: each API's earlier call
    and its result reach the model as text in alternating turns, exactly transformers' render of
    that conversation."""
    from transformers import AutoTokenizer

    model_dir = build_family_model("gemma3")
    # (The engine route: the text sent is the whole render, its BOS included.)
    client, engine = await make_client(tokenizer_dir=model_dir, route="engine")
    shown = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
        {"role": "user", "content": "```tool_output\nsunny\n```\n\nWarm?"},
    ]
    want = AutoTokenizer.from_pretrained(str(model_dir)).apply_chat_template(
        shown, tokenize=False, add_generation_prompt=True
    )
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    chat = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "Warm?"},
    ]
    r = await client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, "messages": chat})
    assert r.status_code == 200, r.text
    anthropic = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"},
                {"type": "text", "text": "Warm?"},
            ],
        },
    ]
    r = await client.post("/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": anthropic})
    assert r.status_code == 200, r.text
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "Warm?"},
    ]
    r = await client.post("/v1/responses", json={"model": "tiny", "max_output_tokens": 16, "input": items})
    assert r.status_code == 200, r.text
    r = await client.post("/tokenize", json={"model": "tiny", "messages": chat})
    assert r.status_code == 200, r.text
    assert [request.prompt_text for request in engine.requests] == [want] * 3
    assert engine.tokenizer.decode(r.json()["tokens"], skip_special_tokens=False) == want
