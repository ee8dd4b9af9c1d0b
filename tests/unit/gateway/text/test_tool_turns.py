"""A tool conversation on a chat template with no tool turn (Gemma 3's, Llama 2's) or one that never
reads an assistant's `tool_calls` (Llama 3's packaged template, DeepSeek V3's own as the gateway
hands calls over): the calls and results as text in the turns the template has, from every API;
and the templates that render both get the conversation byte for byte as before. Every expectation
is transformers' own render of the conversation written out by hand."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.apis.chat_completions.protocol import ChatMessageIn
from gateway.apis.chat_completions.serving import _template_message
from gateway.apis.messages.protocol import MessageCreateRequest
from gateway.apis.messages.translate import to_chat
from gateway.apis.responses.items import parse_input, to_messages
from gateway.core.prompt import template_messages
from gateway.media import ImageRef
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls.registry import template_call_ids
from gateway.text.tool_turns import tool_turns_as_text
from tests.support.tokenizers import loaded_tokenizer
from tests.unit.gateway.text.family_replies import TOOLS, family_dir
from tests.unit.gateway.text.test_family_templates import (
    TIME_ARGS,
    WEATHER_ARGS,
    anthropic_messages,
    chat_messages,
    responses_messages,
)

TEMPLATES = Path(__file__).parents[3] / "data" / "chat_templates"
# (family, template file or None for the family's own) -> (renders tool results, renders calls).
RENDERS = {
    ("qwen3", None): (True, True),
    ("gptoss", None): (True, True),
    ("mistral", None): (True, True),
    ("llama3_1", "llama3_1_json_tools.jinja"): (True, True),
    ("deepseek_v3", "deepseek_v3_tools.jinja"): (True, True),
    # Writes any role's content under its header, and never reads tool_calls.
    ("llama3_1", None): (True, False),
    # Writes tool outputs; its call branch is for a null content (the gateway hands "") and pastes
    # the arguments in as a string.
    ("deepseek_v3", None): (True, False),
    # Refuse any role but alternating user and assistant turns.
    ("gemma3", None): (False, False),
    ("llama2", None): (False, False),
}
TOOL_PARSERS = {"qwen3": "hermes", "gptoss": "openai", "mistral": "mistral", "llama3_1": "llama3_json"}


@functools.cache
def tokenizer(family: str, template: str | None) -> Tokenizer:
    return loaded_tokenizer(family_dir(family), chat_template_file=TEMPLATES / template if template else None)


@functools.cache
def reference(family: str) -> Any:
    return AutoTokenizer.from_pretrained(str(family_dir(family)), local_files_only=True)


def transformers_render(
    family: str, template: str | None, messages: list[dict[str, Any]], **kwargs: Any
) -> str:
    chat_template = (TEMPLATES / template).read_text(encoding="utf-8") if template else None
    return str(
        reference(family).apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=chat_template, **kwargs
        )
    )


def gateway_render(
    family: str,
    template: str | None,
    messages: list[dict[str, Any]],
    tool_parser: str = "none",
    **kwargs: Any,
) -> str:
    tok = tokenizer(family, template)
    runtime: Any = SimpleNamespace(config=SimpleNamespace(tool_parser=tool_parser), tokenizer=tok)
    return tok.apply_chat_template(template_messages(runtime, messages), **kwargs)


def api_conversations(*, long_ids: bool = False) -> list[list[dict[str, Any]]]:
    conversations = [chat_messages(), responses_messages(), anthropic_messages()]
    if long_ids:  # nine characters, the only ids Mistral's template takes
        conversations = [
            json.loads(json.dumps(m).replace('"c1"', '"c00000001"').replace('"c2"', '"c00000002"'))
            for m in conversations
        ]
    return conversations


@pytest.mark.parametrize(("family", "template"), list(RENDERS))
def test_the_probes_tell_which_templates_render_tool_results_and_calls(
    family: str, template: str | None
) -> None:
    tok = tokenizer(family, template)
    assert (tok.renders_tool_results, tok.renders_tool_calls) == RENDERS[(family, template)]


@pytest.mark.parametrize(("family", "template"), [key for key, renders in RENDERS.items() if all(renders)])
def test_templates_that_render_tool_turns_get_the_conversation_unchanged(
    family: str, template: str | None
) -> None:
    parser = TOOL_PARSERS.get(family, "deepseek_v3")
    for messages in api_conversations(long_ids=True):
        # What was rendered before: the messages with only the call ids in the format's form.
        want = transformers_render(family, template, template_call_ids(parser, messages), tools=TOOLS)
        assert gateway_render(family, template, messages, parser, tools=TOOLS) == want


CALLS_TEXT = (
    '[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
    '{"name": "get_time", "arguments": {"zone": "CET"}}]'
)
RESULTS_TEXT = "```tool_output\nsunny\n```\n\n```tool_output\n12:00\n```"


@pytest.mark.parametrize("family", ["gemma3", "llama2"])
def test_on_a_template_with_no_tool_turn_calls_and_results_are_text_in_alternating_turns(family: str) -> None:
    want = transformers_render(
        family,
        None,
        [
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": CALLS_TEXT},
            {"role": "user", "content": RESULTS_TEXT},
            {"role": "assistant", "content": "Sunny, and it is noon."},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
    )
    for messages in api_conversations():
        assert gateway_render(family, None, messages) == want


@pytest.mark.parametrize("family", ["gemma3", "llama2"])
def test_results_and_the_user_turn_after_them_are_one_user_turn(family: str) -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": WEATHER_ARGS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": "Warm?"},
    ]
    anthropic = {
        "model": "m",
        "max_tokens": 8,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "c1", "name": "get_weather", "input": json.loads(WEATHER_ARGS)}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"},
                    {"type": "text", "text": "Warm?"},
                ],
            },
        ],
    }
    want = transformers_render(
        family,
        None,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
            },
            {"role": "user", "content": "```tool_output\nsunny\n```\n\nWarm?"},
        ],
    )
    chat_turns = [_template_message(ChatMessageIn.model_validate(m), i, []) for i, m in enumerate(chat)]
    assert gateway_render(family, None, chat_turns) == want
    assert (
        gateway_render(family, None, to_chat(MessageCreateRequest.model_validate(anthropic)).messages) == want
    )


def test_an_image_in_a_tool_result_is_rendered_in_place_in_the_user_turn() -> None:
    """Claude Code's Read of a PNG: the tool_result's image block, on Gemma 3's template."""
    body = {
        "model": "m",
        "max_tokens": 8,
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
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [
                            {"type": "text", "text": "The file:"},
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                            },
                        ],
                    },
                    {"type": "text", "text": "What is in it?"},
                ],
            },
        ],
    }
    chat = to_chat(MessageCreateRequest.model_validate(body))
    want = transformers_render(
        "gemma3",
        None,
        [
            {"role": "user", "content": "Read shot.png"},
            {"role": "assistant", "content": '{"name": "Read", "arguments": {"file_path": "shot.png"}}'},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "```tool_output\nThe file:"},
                    {"type": "image"},
                    {"type": "text", "text": "\n```\n\nWhat is in it?"},
                ],
            },
        ],
    )
    rendered = gateway_render("gemma3", None, chat.messages)
    assert rendered == want
    assert rendered.count("<start_of_image>") == 1 and len(chat.images) == 1


def test_an_image_in_a_function_call_output_is_rendered_in_place() -> None:
    items = [
        {"role": "user", "content": "Screenshot?"},
        {"type": "function_call", "call_id": "c1", "name": "shoot", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}],
        },
    ]
    refs: list[ImageRef] = []
    messages = to_messages(parse_input(items), None, reasoning_text=lambda item, position: None, images=refs)
    want = transformers_render(
        "gemma3",
        None,
        [
            {"role": "user", "content": "Screenshot?"},
            {"role": "assistant", "content": '{"name": "shoot", "arguments": {}}'},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "```tool_output\n"},
                    {"type": "image"},
                    {"type": "text", "text": "\n```"},
                ],
            },
        ],
    )
    assert gateway_render("gemma3", None, messages) == want
    assert len(refs) == 1


def test_calls_a_template_drops_are_written_in_the_models_own_keys() -> None:
    """Llama 3's packaged template writes tool turns but no calls: a Llama 3 model's guided calls
    are `{"name": ..., "parameters": ...}`, and that is what it is shown."""
    want = transformers_render(
        "llama3_1",
        None,
        [
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": CALLS_TEXT.replace('"arguments"', '"parameters"')},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
            {"role": "assistant", "content": "Sunny, and it is noon."},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
    )
    assert gateway_render("llama3_1", None, chat_messages(), "llama3_json") == want


def test_deepseek_v3s_own_template_keeps_its_tool_outputs_and_is_shown_the_calls() -> None:
    want = transformers_render(
        "deepseek_v3",
        None,
        [
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": CALLS_TEXT},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
            {"role": "assistant", "content": "Sunny, and it is noon."},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
    )
    rendered = gateway_render("deepseek_v3", None, chat_messages(), "deepseek_v3")
    assert rendered == want
    assert "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>" in rendered


def test_a_conversation_is_never_changed_in_place() -> None:
    messages = chat_messages()
    before = json.dumps(messages)
    out = tool_turns_as_text(messages, results_rendered=False, calls_rendered=False)
    assert out is not messages and json.dumps(messages) == before
    assert tool_turns_as_text(messages, results_rendered=True, calls_rendered=True) is messages
    plain = [{"role": "user", "content": "hi"}]
    assert tool_turns_as_text(plain, results_rendered=False, calls_rendered=False) is plain


def test_a_single_call_is_one_object_and_its_text_follows_the_turns_text() -> None:
    messages = [
        {"role": "user", "content": "Time?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": json.loads(TIME_ARGS)},
                }
            ],
        },
    ]
    out = tool_turns_as_text(messages, results_rendered=True, calls_rendered=False)
    assert out[1] == {
        "role": "assistant",
        "content": 'Let me look.\n\n{"name": "get_time", "arguments": {"zone": "CET"}}',
    }


SKIPPING_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] in ('user', 'assistant') %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_template_that_silently_skips_tool_turns_is_shown_them(tmp_path: Path) -> None:
    """No error to tell: the probe finds the result and the call missing from the render."""
    path = tmp_path / "skipping.jinja"
    path.write_text(SKIPPING_TEMPLATE, encoding="utf-8")
    tok = loaded_tokenizer(family_dir("llama2"), chat_template_file=path)
    assert (tok.renders_tool_results, tok.renders_tool_calls) == (False, False)
    runtime: Any = SimpleNamespace(config=SimpleNamespace(tool_parser="none"), tokenizer=tok)
    want = reference("llama2").apply_chat_template(
        [
            {"role": "user", "content": "Weather and time in Paris?"},
            {"role": "assistant", "content": CALLS_TEXT},
            {"role": "user", "content": RESULTS_TEXT},
            {"role": "assistant", "content": "Sunny, and it is noon."},
            {"role": "user", "content": "Thanks! And tomorrow?"},
        ],
        tokenize=False,
        add_generation_prompt=True,
        chat_template=SKIPPING_TEMPLATE,
    )
    assert tok.apply_chat_template(template_messages(runtime, chat_messages())) == want


# (family, template file or None for the family's own) -> renders a system turn after the first message.
LATE_SYSTEM = {
    ("qwen3", None): True,
    ("llama3_1", None): True,
    ("gemma3", None): False,
}


@pytest.mark.parametrize(("family", "template"), list(LATE_SYSTEM))
def test_the_probe_tells_which_templates_render_a_later_system_turn(
    family: str, template: str | None
) -> None:
    assert tokenizer(family, template).renders_late_system is LATE_SYSTEM[(family, template)]


# Claude Code's turn: its reminder and the question (one user turn once the Messages API combines
# them), then its environment as a system message, the reply, and a user turn after it.
CLAUDE_CODE_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "<system-reminder>Read chart.png</system-reminder>\n\nWhat is in it?"},
    {"role": "system", "content": "# Environment\nWorking directory: /work"},
    {"role": "assistant", "content": "A chart."},
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Output token limit hit. Resume directly."},
]


@pytest.mark.parametrize(("family", "template"), [k for k, renders in LATE_SYSTEM.items() if renders])
def test_templates_that_render_a_later_system_turn_get_it_unchanged(
    family: str, template: str | None
) -> None:
    want = transformers_render(family, template, CLAUDE_CODE_TURNS)
    assert gateway_render(family, template, CLAUDE_CODE_TURNS) == want


def test_on_gemma_3_a_later_system_turn_is_text_in_the_user_turn_beside_it() -> None:
    want = transformers_render(
        "gemma3",
        None,
        [
            {
                "role": "user",
                "content": "<system-reminder>Read chart.png</system-reminder>\n\nWhat is in it?\n\n"
                "# Environment\nWorking directory: /work",
            },
            {"role": "assistant", "content": "A chart."},
            {"role": "user", "content": "Be brief.\n\nOutput token limit hit. Resume directly."},
        ],
    )
    assert gateway_render("gemma3", None, CLAUDE_CODE_TURNS) == want
    # A leading system prompt stays the template's own; one right after it has no user turn before it.
    messages = [
        {"role": "system", "content": "You describe pictures."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
    ]
    want = transformers_render(
        "gemma3",
        None,
        [
            {"role": "system", "content": "You describe pictures."},
            {"role": "user", "content": "Be brief.\n\nHi."},
        ],
    )
    assert gateway_render("gemma3", None, messages) == want
    assert messages[1] == {"role": "system", "content": "Be brief."}  # never changed in place


def test_a_later_system_turn_from_the_messages_api_reaches_gemma_3s_template() -> None:
    request = MessageCreateRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 8,
            "system": "You describe pictures.",
            "messages": [
                {"role": "user", "content": "<system-reminder>Read chart.png</system-reminder>"},
                {"role": "user", "content": [{"type": "text", "text": "What is in it?"}]},
                {"role": "system", "content": "# Environment"},
                {"role": "assistant", "content": [{"type": "text", "text": "A chart."}]},
                {"role": "user", "content": [{"type": "text", "text": "Resume directly."}]},
            ],
        }
    )
    want = transformers_render(
        "gemma3",
        None,
        [
            {"role": "system", "content": "You describe pictures."},
            {
                "role": "user",
                "content": "<system-reminder>Read chart.png</system-reminder>\n\nWhat is in it?"
                "\n\n# Environment",
            },
            {"role": "assistant", "content": "A chart."},
            {"role": "user", "content": "Resume directly."},
        ],
    )
    assert gateway_render("gemma3", None, to_chat(request).messages) == want
