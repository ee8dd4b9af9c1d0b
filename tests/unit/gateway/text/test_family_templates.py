"""A tool-calling conversation back through each family's chat template: the earlier calls (their
arguments handed over as an object, which the template serializes itself: never encoded twice),
the tool results and the next turns, the same from the chat completions, Responses and Messages
APIs; and the calls the model wrote, parsed and handed back, render as the model wrote them.

Qwen3's template and the gpt-oss one are the family's; Llama 3's package renders no tools and
DeepSeek V3's renders no call-only turn through transformers (see tests/data/README.md), so those
two use templates of the family's format written for the tests."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.apis.chat_completions.protocol import ChatMessageIn
from gateway.apis.chat_completions.serving import _template_message
from gateway.apis.messages.protocol import MessageCreateRequest
from gateway.apis.messages.translate import to_chat
from gateway.apis.responses.items import parse_input, to_messages
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls import parse_tool_calls
from tests.support.tokenizers import loaded_tokenizer
from tests.unit.gateway.text.family_replies import PARAMETERS, TOOLS, family_dir, family_tokenizer

TEMPLATES = Path(__file__).parents[3] / "data" / "chat_templates"
TOOL_TEMPLATES = {
    "llama3_1": TEMPLATES / "llama3_1_json_tools.jinja",
    "deepseek_v3": TEMPLATES / "deepseek_v3_tools.jinja",
    "deepseek_r1": TEMPLATES / "deepseek_v3_tools.jinja",
}
WEATHER_ARGS = '{"city": "Paris", "days": 3}'
TIME_ARGS = '{"zone": "CET"}'
DS = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"

# What each family's template writes for the two calls and their results (the calls exactly as the
# model writes them, see test_family_tool_formats).
RENDERED = {
    "qwen3": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n</tool_response>",
    ],
    "deepseek_v3": [
        "<｜tool▁calls▁begin｜>"
        + DS.format(name="get_weather", args=WEATHER_ARGS)
        + "\n"
        + DS.format(name="get_time", args=TIME_ARGS)
        + "<｜tool▁calls▁end｜>",
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>\n"
        "<｜tool▁output▁begin｜>12:00<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
    ],
    "gptoss": [
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        + WEATHER_ARGS
        + "<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
        + TIME_ARGS
        + "<|call|>",
        # Each result from the function its call named (the results carry only the call's id).
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>"
        "<|start|>functions.get_time to=assistant<|channel|>commentary<|message|>12:00<|end|>",
    ],
    "llama3_1": [
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}<|eom_id|>',
        "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>",
    ],
}
RENDERED["deepseek_r1"] = RENDERED["deepseek_v3"]


@functools.cache
def tokenizer(family: str) -> Tokenizer:
    if family not in TOOL_TEMPLATES:
        return family_tokenizer(family)
    return loaded_tokenizer(family_dir(family), chat_template_file=TOOL_TEMPLATES[family])


def chat_messages(weather: str = WEATHER_ARGS, clock: str = TIME_ARGS) -> list[dict[str, Any]]:
    raw: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather and time in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": weather}},
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": clock}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
        {"role": "assistant", "content": "Sunny, and it is noon."},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ]
    return [_template_message(ChatMessageIn.model_validate(m), i, []) for i, m in enumerate(raw)]


def responses_messages() -> list[dict[str, Any]]:
    items = [
        {"role": "user", "content": "Weather and time in Paris?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": WEATHER_ARGS},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": TIME_ARGS},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": "12:00"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny, and it is noon."}]},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ]
    return to_messages(parse_input(items), None, reasoning_text=lambda item, position: None)


def anthropic_messages() -> list[dict[str, Any]]:
    body = {
        "model": "m",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "Weather and time in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "get_weather",
                        "input": json.loads(WEATHER_ARGS),
                    },
                    {"type": "tool_use", "id": "c2", "name": "get_time", "input": json.loads(TIME_ARGS)},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "12:00"},
                ],
            },
            {"role": "assistant", "content": "Sunny, and it is noon."},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
    }
    return to_chat(MessageCreateRequest.model_validate(body)).messages


FAMILIES = ["qwen3", "deepseek_v3", "deepseek_r1", "gptoss", "llama3_1"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tool_conversation_renders_through_the_familys_template_from_every_api(family: str) -> None:
    tok = tokenizer(family)
    prompts = [
        tok.apply_chat_template(messages, tools=TOOLS)
        for messages in (chat_messages(), responses_messages(), anthropic_messages())
    ]
    assert prompts[1] == prompts[0]
    assert prompts[2] == prompts[0]
    prompt = prompts[0]
    calls, results = RENDERED[family]
    assert prompt.count(calls) == 1, prompt
    assert results in prompt
    # Never encoded twice: no arguments object written as a JSON string.
    assert '\\"city\\"' not in prompt and '"{' not in prompt
    assert prompt.index(calls) < prompt.index("Thanks! And tomorrow?")


@pytest.mark.parametrize(
    ("family", "tool_parser", "written"),
    [
        (
            "qwen3",
            "hermes",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>',
        ),
        (
            "llama3_1",
            "llama3_json",
            '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
            '{"name": "get_time", "parameters": {"zone": "CET"}}',
        ),
    ],
)
def test_calls_the_model_wrote_come_back_as_it_wrote_them(
    family: str, tool_parser: str, written: str
) -> None:
    """The gateway's answer (compact arguments, as OpenAI returns them) handed back by a client
    renders, through a template that serializes the arguments itself, as the model's own text."""
    parsed = parse_tool_calls(written, tool_parser, tool_names=PARAMETERS)
    assert [c.arguments for c in parsed.tool_calls] == ['{"city":"Paris","days":3}', '{"zone":"CET"}']
    prompt = tokenizer(family).apply_chat_template(
        chat_messages(parsed.tool_calls[0].arguments, parsed.tool_calls[1].arguments), tools=TOOLS
    )
    assert written in prompt
