"""The gateway's chat template render (tool lists prepared once, text.template) against
transformers' own `apply_chat_template(tokenize=False)`: the same text, or both refusing, for every
family's template, on generated conversations, tool lists sent again and again (the remembered
copy and its `tojson` results), and template arguments."""

from __future__ import annotations

import copy
import functools
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.tiny_model import build_tiny_model
from gateway.errors import InvalidRequestError
from gateway.text.template import ChatRenderer, _ToolLists
from gateway.text.tokenizer import Tokenizer
from tests.support.tokenizers import loaded_tokenizer
from tests.unit.gateway.text.family_replies import family_tokenizer
from tests.unit.gateway.text.test_family_templates import tokenizer as family_template_tokenizer

# Every family, and the tool templates the tests write for the two whose package renders none.
CASES = [
    "qwen3",
    "llama3_1",
    "llama3_1-tools",
    "deepseek_v3",
    "deepseek_v3-tools",
    "deepseek_r1",
    "gptoss",
    "gemma3",
    "mistral",
    "llama2",
    "agent",
]


def tokenizer(case: str) -> Tokenizer:
    # The same tokenizers the other family tests load (loading one takes seconds).
    if case == "agent":
        return agent_tokenizer()
    if case.endswith("-tools"):
        return family_template_tokenizer(case.split("-")[0])
    return family_tokenizer(case)


@functools.cache
def agent_tokenizer() -> Tokenizer:
    return loaded_tokenizer(build_tiny_model("agent"))


def transformers_render(tok: Tokenizer, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    try:
        return str(
            tok._tok.apply_chat_template(
                copy.deepcopy(messages),
                tokenize=False,
                add_generation_prompt=True,
                chat_template=tok._chat_template,
                **copy.deepcopy(kwargs),
            )
        )
    except Exception:
        return None


def gateway_render(tok: Tokenizer, messages: list[dict[str, Any]], **kwargs: Any) -> str | None:
    try:
        return tok.apply_chat_template(messages, **kwargs)
    except InvalidRequestError:
        return None


text = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6),
        st.sampled_from(["<|im_start|>", "<tool_call>", "{{", "}}", "</think>", "<think>", "\n", " ", '"']),
    ),
    max_size=6,
).map("".join)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
tool = st.builds(
    lambda name, description, props: {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]},
        },
    },
    st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
    text,
    st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["string", "integer"])}, optional={"description": text}
        ),
        max_size=3,
    ),
)
tool_lists = st.lists(tool, min_size=1, max_size=4)
call = st.builds(
    lambda name, args: {"id": "call_1", "type": "function", "function": {"name": name, "arguments": args}},
    st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
    st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), json_value, max_size=3),
)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text)})
        if draw(st.booleans()):
            calls = draw(st.lists(call, min_size=1, max_size=2))
            # A call-only turn's content as OpenAI clients send it: null (dropped before the render).
            content = draw(st.none() | text)
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            messages.extend({"role": "tool", "content": draw(text), "tool_call_id": "call_1"} for _ in calls)
        message: dict[str, Any] = {"role": "assistant", "content": draw(text)}
        if draw(st.booleans()):
            message["reasoning_content"] = draw(text)
        messages.append(message)
    messages.append({"role": "user", "content": draw(text)})
    return messages


template_kwargs = st.fixed_dictionaries(
    {},
    optional={
        "enable_thinking": st.booleans(),
        "reasoning_effort": st.sampled_from(["low", "high"]),
        "custom": json_value,
    },
)


@pytest.mark.parametrize("case", CASES)
def test_the_renderer_is_used_for_every_family(case: str) -> None:
    assert tokenizer(case)._renderer is not None


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations(), tools=st.none() | tool_lists, kwargs=template_kwargs, data=st.data())
def test_a_render_is_transformers_render(
    case: str, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], data: st.DataObject
) -> None:
    tok = tokenizer(case)
    if tools is not None:
        if not tok.renders_tools:
            return
        kwargs = {**kwargs, "tools": tools}
    want = transformers_render(tok, messages, **kwargs)
    # Twice: the second render takes the remembered tool list and its tojson results, and so does
    # a request sending the same list as new objects (parsed again from its JSON).
    assert gateway_render(tok, messages, **kwargs) == want
    again = json.loads(json.dumps(kwargs))
    assert gateway_render(tok, json.loads(json.dumps(messages)), **again) == want
    # A growing conversation: the same tools, one turn more.
    turn = [{"role": "assistant", "content": data.draw(text)}, {"role": "user", "content": "next"}]
    longer = [*messages, *turn]
    assert gateway_render(tok, longer, **kwargs) == transformers_render(tok, longer, **kwargs)


def test_an_agent_conversation_with_many_tools_renders_as_transformers_does() -> None:
    import random

    from loadtest.bench_long import Sizer, new_conversation

    tok = tokenizer("qwen3")
    conv = new_conversation(Sizer(tok), random.Random(3), 4000, "s")
    messages = [*conv.messages, {"role": "user", "content": "go on"}]
    want = transformers_render(tok, messages, tools=conv.tools)
    for _ in range(3):
        assert tok.apply_chat_template(messages, tools=json.loads(json.dumps(conv.tools))) == want


def test_a_tool_list_is_remembered_by_its_json_text_and_tojson_of_its_parts() -> None:
    tools = _ToolLists(copy.deepcopy, capacity=2)
    original = [{"a": [1, 2.5, "x"], "b": {"c": None}}]
    first = tools.get(original)
    assert first == original and first is not original
    assert tools.get(json.loads(json.dumps(original))) is first
    calls: list[Any] = []

    def dumps(value: Any, **kwargs: Any) -> str:
        calls.append(value)
        return json.dumps(value, **kwargs)

    tojson = tools.tojson(dumps)
    assert tojson(first[0], indent=2) == json.dumps(original[0], indent=2)
    assert tojson(first[0], indent=2) == json.dumps(original[0], indent=2)
    assert tojson(first[0]) == json.dumps(original[0])
    assert len(calls) == 2  # one per distinct arguments
    # Objects not from a remembered list are serialized each time.
    other = {"a": 1}
    tojson(other)
    tojson(other)
    assert len(calls) == 4
    # Evicted lists are forgotten with their parts.
    tools.get([{"n": 1}])
    tools.get([{"n": 2}])
    assert id(first[0]) not in tools.frozen
    assert tools.get(json.loads(json.dumps(original))) is not first


def test_values_json_cannot_tell_apart_are_not_remembered() -> None:
    tools = _ToolLists(copy.deepcopy)
    with_tuple = [{"a": (1, 2)}]
    assert tools.get(with_tuple) == with_tuple
    assert tools.get([{"a": [1, 2]}])["a" if False else 0]["a"] == [1, 2]
    nan = [{"a": math.nan}]
    assert tools.get(nan) is not tools.get(nan)
    assert tools.get([{"a": None}])[0]["a"] is None


def test_calls_with_apply_chat_template_arguments_go_to_transformers() -> None:
    tok = tokenizer("qwen3")
    renderer = tok._renderer
    assert isinstance(renderer, ChatRenderer)
    messages = [{"role": "user", "content": "hi"}]
    assert renderer.handles(messages, {"tools": [{"type": "function"}], "enable_thinking": False})
    assert not renderer.handles(messages, {"documents": [{"title": "a", "text": "b"}]})
    assert not renderer.handles(messages, {"continue_final_message": True})
    assert not renderer.handles([], {})
    assert not renderer.handles(messages, {"tools": ["not a dict"]})
