"""A reasoning model on chat completions and the Responses API (the ASGI app, a scripted engine, the
agent tiny tokenizer with its `<think>` tokens; gpt-oss's own for harmony): thinking apart from the
answer, streamed and whole alike, its tokens counted, tool calls after it, handed back; the
chat template's variables (`chat_template_kwargs`, `reasoning_effort`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.families import build_family_model
from gateway.errors import ServerConfigError
from tests.api.conftest import MakeClient
from tests.api.test_chat_api import chunks_of
from tests.api.test_responses_api import sse_events
from tests.support.fake_engine import FakeEngine
from tests.support.fixtures import tiny_agent_dir  # noqa: F401
from tests.support.openai_schema import validate

USER = [{"role": "user", "content": "Weather in Paris?"}]
THOUGHT = "The user wants the weather. 你好 🙂 I should answer."
ANSWER = "It is sunny in Paris."
# What the model writes after a prompt that opened the think block (enable_thinking).
OPENED = f"{THOUGHT}\n</think>\n\n{ANSWER}"
# What it writes when it opens the block itself.
SELF_OPENED = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture
def make_agent(make_client: MakeClient, tiny_agent_dir: Path, tmp_path: Path) -> MakeClient:  # noqa: F811
    async def factory(
        model: dict[str, Any] | None = None, **kwargs: Any
    ) -> tuple[httpx.AsyncClient, FakeEngine]:
        settings = {"state_dir": tmp_path / "state", **kwargs.pop("settings", {})}
        return await make_client(
            settings=settings,
            model={"reasoning_parser": "qwen3", **(model or {})},
            tokenizer_dir=kwargs.pop("tokenizer_dir", tiny_agent_dir),
            **kwargs,
        )

    return factory  # type: ignore[return-value]


def thinking_tokens(engine: FakeEngine, before_marker: str) -> int:
    """The tokens the model spent thinking: everything before `</think>`, which is one token."""
    count = len(engine.tokenizer.encode(before_marker, add_special_tokens=False))
    assert count > 0
    return count


async def chat(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    body.setdefault("model", "tiny")
    body.setdefault("messages", USER)
    return await client.post("/v1/chat/completions", json=body)


# ---------------------------------------------------------------- chat completions


async def test_chat_thinking_goes_to_reasoning_content_never_into_content(make_agent: MakeClient) -> None:
    client, engine = await make_agent(reply=lambda req, i: OPENED)
    r = await chat(client, chat_template_kwargs={"enable_thinking": True})
    assert r.status_code == 200, r.text
    body = r.json()
    validate("CreateChatCompletionResponse", body)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == THOUGHT
    assert message["content"] == ANSWER
    assert engine.requests[-1].prompt_text.endswith("<think>\n")
    usage = body["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": thinking_tokens(engine, THOUGHT + "\n")}
    assert usage["completion_tokens"] == len(engine.tokenizer.encode(OPENED, add_special_tokens=False))


async def test_chat_streamed_reasoning_content_equals_the_whole_one(make_agent: MakeClient) -> None:
    client, engine = await make_agent(reply=lambda req, i: SELF_OPENED)
    whole = (await chat(client)).json()
    r = await chat(client, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200, r.text
    chunks = chunks_of(r.text)
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
    content = "".join(d.get("content") or "" for d in deltas)
    assert len(reasoning) > 1, "the thinking streams as it is generated"
    assert "".join(reasoning) == whole["choices"][0]["message"]["reasoning_content"] == THOUGHT
    assert content == whole["choices"][0]["message"]["content"] == ANSWER
    # No delta carries both, and the thinking comes first.
    assert not any("reasoning_content" in d and d.get("content") for d in deltas)
    last_thought = max(i for i, d in enumerate(deltas) if "reasoning_content" in d)
    assert all(not d.get("content") for d in deltas[:last_thought])
    assert chunks[-1]["usage"] == whole["usage"]
    # Between `<think>` and `</think>`, each one token.
    thought_tokens = thinking_tokens(engine, "\n" + THOUGHT + "\n")
    assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] == thought_tokens


async def test_chat_tool_calls_after_thinking_still_parse(make_agent: MakeClient) -> None:
    reply = f"<think>Needs a tool.</think>Checking.{CALL}"
    client, _ = await make_agent(model={"tool_parser": "hermes"}, reply=lambda req, i: reply)
    body = (await chat(client, tools=[WEATHER])).json()
    validate("CreateChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Needs a tool."
    assert choice["message"]["content"] == "Checking."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}

    r = await chat(client, tools=[WEATHER], stream=True)
    deltas = [c["choices"][0]["delta"] for c in chunks_of(r.text) if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Needs a tool."
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    streamed = "".join(
        t["function"].get("arguments", "")
        for d in deltas
        for t in d.get("tool_calls") or []
        if "function" in t
    )
    assert json.loads(streamed) == {"city": "Paris"}
    assert chunks_of(r.text)[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_chat_accepts_an_assistant_turn_handed_back_with_its_reasoning_content(
    make_agent: MakeClient,
) -> None:
    client, engine = await make_agent(model={"tool_parser": "hermes"}, reply=lambda req, i: SELF_OPENED)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I need the weather tool.",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = await chat(client, messages=messages, tools=[WEATHER])
    assert r.status_code == 200, r.text
    # The template renders it back inside the ongoing tool loop.
    assert "<think>\nI need the weather tool.\n</think>" in engine.requests[-1].prompt_text
    # vLLM's newer name for it is taken too.
    messages[1] = {**messages[1], "reasoning": "Other words.", "reasoning_content": None}
    r = await chat(client, messages=messages, tools=[WEATHER])
    assert r.status_code == 200, r.text
    assert "<think>\nOther words.\n</think>" in engine.requests[-1].prompt_text


async def test_a_model_without_a_reasoning_parser_keeps_the_thinking_in_content(
    make_client: MakeClient,
) -> None:
    client, _ = await make_client(reply=lambda req, i: SELF_OPENED)
    body = (await chat(client)).json()
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert "completion_tokens_details" not in body["usage"]


async def test_chat_over_a_text_route_counts_the_thinking_by_encoding_it(make_agent: MakeClient) -> None:
    client, engine = await make_agent(reply=lambda req, i: SELF_OPENED, token_ids=False)
    body = (await chat(client)).json()
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    expected = len(engine.tokenizer.encode(THOUGHT, add_special_tokens=False))
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == expected


HARMONY = (
    "<|channel|>analysis<|message|>Need to greet.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>"
)


@pytest.fixture(scope="module")
def harmony_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state folder for the module: the harmony vocabulary is written there once."""
    return tmp_path_factory.mktemp("harmony_state")


@pytest.fixture
def make_gptoss(make_agent: MakeClient, harmony_state: Path) -> MakeClient:
    """A gpt-oss model: harmony's parser reads gpt-oss's own o200k-harmony vocabulary."""

    async def factory(**kwargs: Any) -> tuple[httpx.AsyncClient, FakeEngine]:
        return await make_agent(
            model={"reasoning_parser": "gpt_oss"},
            tokenizer_dir=build_family_model("gptoss"),
            settings={"state_dir": harmony_state},
            **kwargs,
        )

    return factory  # type: ignore[return-value]


async def test_gpt_oss_is_decoded_with_its_special_markers_and_split(make_gptoss: MakeClient) -> None:
    client, engine = await make_gptoss(reply=lambda req, i: HARMONY)
    body = (await chat(client)).json()
    message = body["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Need to greet.", "Hello there!")
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == thinking_tokens(
        engine, "Need to greet."
    )
    r = await chat(client, stream=True)
    deltas = [c["choices"][0]["delta"] for c in chunks_of(r.text) if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need to greet."
    assert "".join(d.get("content") or "" for d in deltas) == "Hello there!"


@pytest.mark.parametrize("parsers", [{"reasoning_parser": "gpt_oss"}, {"tool_parser": "openai"}])
async def test_a_harmony_model_without_the_o200k_harmony_vocabulary_is_refused_at_start_up(
    make_agent: MakeClient, parsers: dict[str, str]
) -> None:
    # The agent tiny tokenizer holds harmony's markers, but not gpt-oss's vocabulary.
    with pytest.raises(ServerConfigError, match="needs the o200k-harmony vocabulary of gpt-oss") as raised:
        await make_agent(model={"reasoning_parser": "none", **parsers})
    assert "\n" not in raised.value.message


async def test_gpt_oss_over_a_route_that_returns_text_is_a_clear_error(make_gptoss: MakeClient) -> None:
    client, _ = await make_gptoss(token_ids=False)
    r = await chat(client)
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["code"] == "reasoning_parser_needs_token_ids"
    assert "route=engine" in error["message"] and "gpt_oss" in error["message"]


async def test_chat_template_kwargs_and_reasoning_effort_reach_the_template(
    make_agent: MakeClient, tmp_path: Path
) -> None:
    template = tmp_path / "t.jinja"
    template.write_text(
        "{{ 'think=' ~ (enable_thinking if enable_thinking is defined else 'default') }}"
        "{{ ' effort=' ~ (reasoning_effort if reasoning_effort is defined else 'default') }}"
        "{{ ' custom=' ~ (custom if custom is defined else 'default') }}"
    )
    client, engine = await make_agent(model={"chat_template": str(template)}, reply=lambda req, i: ANSWER)
    cases = [
        ({}, "think=default effort=default custom=default"),
        ({"chat_template_kwargs": {"enable_thinking": False}}, "think=False effort=default custom=default"),
        ({"reasoning_effort": "low"}, "think=default effort=low custom=default"),
        # OpenAI's efforts onto the low/medium/high templates take; "none" switches thinking off.
        ({"reasoning_effort": "xhigh"}, "think=default effort=high custom=default"),
        ({"reasoning_effort": "minimal"}, "think=default effort=low custom=default"),
        ({"reasoning_effort": "none"}, "think=False effort=default custom=default"),
        # An unknown key is the template's business; the kwargs say the effort more precisely.
        (
            {"reasoning_effort": "low", "chat_template_kwargs": {"custom": [1], "reasoning_effort": "high"}},
            "think=default effort=high custom=[1]",
        ),
    ]
    for extra, prompt in cases:
        r = await chat(client, **extra)
        assert r.status_code == 200, r.text
        assert engine.requests[-1].prompt_text == prompt, extra
        assert "x-gateway-ignored-fields" not in r.headers


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
        ({"chat_template_kwargs": [{"enable_thinking": False}]}, "chat_template_kwargs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
    ],
)
async def test_a_bad_template_variable_is_a_400_naming_it(
    make_agent: MakeClient, extra: dict[str, Any], param: str
) -> None:
    client, _ = await make_agent()
    r = await chat(client, **extra)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


# ---------------------------------------------------------------- Responses API


async def responses(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    body.setdefault("model", "tiny")
    body.setdefault("input", "Weather in Paris?")
    return await client.post("/v1/responses", json=body)


async def test_a_response_has_a_reasoning_item_before_its_message_and_counts_reasoning_tokens(
    make_agent: MakeClient,
) -> None:
    client, engine = await make_agent(reply=lambda req, i: SELF_OPENED)
    r = await responses(client, reasoning={"effort": "low", "summary": "auto"})
    assert r.status_code == 200, r.text
    body = r.json()
    validate("Response", body)
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["status"] == "completed"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert "encrypted_content" not in reasoning
    assert message["type"] == "message" and message["content"][0]["text"] == ANSWER
    details = body["usage"]["output_tokens_details"]
    assert details["reasoning_tokens"] == thinking_tokens(engine, "\n" + THOUGHT + "\n")
    assert "Reasoning: low" in engine.requests[-1].prompt_text
    # Effort "none" is thinking off: the agent template closes an empty think block.
    r = await responses(client, reasoning={"effort": "none"})
    assert r.status_code == 200, r.text
    assert engine.requests[-1].prompt_text.endswith("<think>\n\n</think>\n\n")


def without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


async def test_streamed_reasoning_text_events_build_the_same_response(make_agent: MakeClient) -> None:
    client, _ = await make_agent(reply=lambda req, i: SELF_OPENED)
    whole = (await responses(client)).json()
    r = await responses(client, stream=True)
    events = sse_events(r.text)
    kinds = [e["type"] for e in events]
    first_text = kinds.index("response.output_text.delta")
    assert kinds[: kinds.index("response.reasoning_text.delta")] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    thought = kinds.index("response.reasoning_text.done")
    assert set(kinds[kinds.index("response.reasoning_text.delta") : thought]) == {
        "response.reasoning_text.delta"
    }
    assert kinds[thought : thought + 5] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert thought < first_text and kinds[-1] == "response.completed"
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == THOUGHT
    (done,) = (e for e in events if e["type"] == "response.reasoning_text.done")
    assert done["text"] == THOUGHT and done["output_index"] == 0 and done["content_index"] == 0
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    # The same items (ids aside) and usage as the whole response.
    assert without_ids(final["output"]) == without_ids(whole["output"])
    assert final["usage"] == whole["usage"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


async def test_a_function_call_after_thinking_is_a_function_call_item(make_agent: MakeClient) -> None:
    tool = {"type": "function", **WEATHER["function"]}
    reply = f"<think>Needs a tool.</think>{CALL}"
    client, _ = await make_agent(model={"tool_parser": "hermes"}, reply=lambda req, i: reply)
    body = (await responses(client, tools=[tool])).json()
    validate("Response", body)
    assert [i["type"] for i in body["output"]] == ["reasoning", "function_call"]
    assert body["output"][0]["content"][0]["text"] == "Needs a tool."
    assert json.loads(body["output"][1]["arguments"]) == {"city": "Paris"}


async def test_sealed_reasoning_comes_back_encrypted_and_is_restored_when_handed_back(
    make_agent: MakeClient,
) -> None:
    tool = {"type": "function", **WEATHER["function"]}
    reply = f"<think>Needs a tool.</think>{CALL}"
    client, engine = await make_agent(model={"tool_parser": "hermes"}, reply=lambda req, i: reply)
    first = await responses(client, tools=[tool], store=False, include=["reasoning.encrypted_content"])
    body = first.json()
    validate("Response", body)
    reasoning, call = body["output"]
    sealed = reasoning["encrypted_content"]
    assert sealed and "Needs a tool." not in sealed
    # Codex hands the items back (store false) with the tool's output: the thinking is restored
    # into the assistant turn the template renders.
    handed_back = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": sealed},
        {
            "type": "function_call",
            "call_id": call["call_id"],
            "name": "get_weather",
            "arguments": call["arguments"],
        },
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
    ]
    r = await responses(client, input=handed_back, tools=[tool], store=False)
    assert r.status_code == 200, r.text
    assert "<think>\nNeeds a tool.\n</think>" in engine.requests[-1].prompt_text


async def test_chat_logprobs_cover_thinking_and_answer_alike_whole_and_streamed(
    make_agent: MakeClient,
) -> None:
    client, engine = await make_agent(reply=lambda req, i: SELF_OPENED)
    whole = (await chat(client, logprobs=True)).json()
    entries = whole["choices"][0]["logprobs"]["content"]
    assert len(entries) == len(engine.tokenizer.encode(SELF_OPENED, add_special_tokens=False))
    r = await chat(client, logprobs=True, stream=True)
    chunks = chunks_of(r.text)
    streamed = [
        e for c in chunks if c["choices"] for e in (c["choices"][0]["logprobs"] or {}).get("content") or []
    ]
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    # Each text chunk carries its own tokens' entries: the thinking's go with reasoning_content.
    first = next(
        c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")
    )
    assert first["logprobs"]["content"]
