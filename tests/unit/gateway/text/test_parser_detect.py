"""Naming the parsers that fit a model from its vocabulary and chat template, on the real families."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from gateway.text.parser_detect import suggest_parsers
from tests.unit.gateway.text.family_replies import family_tokenizer
from tests.unit.gateway.text.test_family_templates import tokenizer as tool_template_tokenizer


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("qwen3", ("hermes", "qwen3")),
        ("deepseek_v3", ("deepseek_v3", None)),
        ("deepseek_r1", ("deepseek_v3", "deepseek_r1")),
        ("gptoss", ("openai", "gpt_oss")),
        # Mistral-Nemo's [TOOL_CALLS] control token.
        ("mistral", ("mistral", None)),
        # Llama 3's package template renders no tools: nothing to parse calls of.
        ("llama3_1", (None, None)),
        ("gemma3", (None, None)),
        ("llama2", (None, None)),
    ],
)
def test_each_familys_own_files_name_its_parsers(
    family: str, expected: tuple[str | None, str | None]
) -> None:
    assert suggest_parsers(family_tokenizer(family)) == expected


def test_a_llama_template_that_renders_tools_names_llama3_json() -> None:
    assert suggest_parsers(tool_template_tokenizer("llama3_1")) == ("llama3_json", None)


@dataclass
class Files:
    vocab: Mapping[str, int] = field(default_factory=dict)
    chat_template: str | None = None


def test_the_template_tells_qwen3_coder_from_hermes_and_a_forced_think_block_from_an_optional_one() -> None:
    qwen_vocab = {"<tool_call>": 1, "</tool_call>": 2, "<think>": 3, "</think>": 4, "<|im_start|>": 5}
    coder = "{{ '<tool_call>\\n<function=' + name + '>\\n<parameter=' + key + '>' }}"
    assert suggest_parsers(Files(qwen_vocab, coder)) == ("qwen3_coder", None)
    thinking_only = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    assert suggest_parsers(Files(qwen_vocab, thinking_only)) == ("hermes", "deepseek_r1")
    assert suggest_parsers(Files({"[TOOL_CALLS]": 5}, "")) == ("mistral", None)
    assert suggest_parsers(Files({}, None)) == (None, None)


def test_harmony_tokens_beside_a_template_of_another_format_name_that_format() -> None:
    # The dev stack's agent model: harmony's tokens in its vocabulary, a <tool_call>/<think> template.
    vocab = {
        t: i for i, t in enumerate(("<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<tool_call>"))
    }
    vocab |= {"<think>": 10, "</think>": 11}
    template = "{{ '<tool_call>' }}{% if enable_thinking %}<think>{% endif %}"
    assert suggest_parsers(Files(vocab, template)) == ("hermes", "qwen3")
    assert suggest_parsers(Files(vocab, "{{ '<|start|>assistant<|channel|>final<|message|>' }}")) == (
        "openai",
        "gpt_oss",
    )
