"""Tool-call formats: one file each under text/tool_calls/formats/, listed by the registry, which
also gives the per-model setting its allowed values."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config import ServedModel
from gateway.text.tool_calls import formats
from gateway.text.tool_calls.registry import (
    FORMATS,
    MODEL_FORMATS,
    call_id_maker,
    get_format,
    template_call_ids,
)


def test_every_format_file_is_registered_under_its_own_name() -> None:
    files = {m.name for m in pkgutil.iter_modules(formats.__path__)}
    # "openai" (harmony) is read by the channel parser, "qwen3_xml" is vLLM's other name for qwen3_coder.
    assert files == {name for name in FORMATS if name not in ("none", "openai", "qwen3_xml")}
    for name in files:
        fmt = get_format(name)
        assert fmt is not None and fmt.name == name
    assert get_format("none") is None
    assert get_format("openai") is None
    assert get_format("qwen3_xml") is get_format("qwen3_coder")


def test_the_names_are_vllms() -> None:
    # A vLLM deployment's --tool-call-parser carries over.
    for name in ("llama3_json", "hermes", "qwen3_coder", "mistral", "deepseek_v3", "openai"):
        assert name in MODEL_FORMATS


def test_the_model_setting_accepts_the_registered_model_formats_only(tiny_bpe_dir: Path) -> None:
    for name in MODEL_FORMATS:
        assert ServedModel(name="m", tokenizer=tiny_bpe_dir, tool_parser=name).tool_parser == name
    # "json" is what guided decoding makes a model write, not a model family's format.
    for bad in ("json", "qwen_xml"):
        with pytest.raises(ValidationError, match="tool_parser must be one of none, llama3_json"):
            ServedModel(name="m", tokenizer=tiny_bpe_dir, tool_parser=bad)
    assert "hermes" in ServedModel.model_fields["tool_parser"].description  # type: ignore[operator]


def test_mistral_calls_get_ids_its_template_takes_and_handed_back_ids_are_cut_to_fit() -> None:
    # Mistral's template refuses any id that is not 9 characters; vLLM names Mistral's calls with
    # 9 letters and digits and cuts longer ids handed back to their last 9.
    made = call_id_maker("mistral")()
    assert len(made) == 9 and made.isalnum()
    assert call_id_maker("hermes")().startswith("call_")
    assert call_id_maker("none")().startswith("call_")
    assert call_id_maker("openai")().startswith("call_")
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_abcdefghijKLMNOP123", "function": {"name": "f", "arguments": {}}},
                {"id": "Ab3dE6gH9", "function": {"name": "f", "arguments": {}}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_0123456789abcdefXYZ12345", "content": "1"},
        {"role": "tool", "tool_call_id": "short", "content": "2"},
    ]
    fitted = template_call_ids("mistral", messages)
    assert [c["id"] for c in fitted[1]["tool_calls"]] == ["KLMNOP123", "Ab3dE6gH9"]
    # Too short to fit: left for the template to refuse in its own words.
    assert [m["tool_call_id"] for m in fitted[2:]] == ["fXYZ12345", "short"]
    # The client's messages are not changed in place; other formats' ids go as they came.
    assert messages[1]["tool_calls"][0]["id"] == "call_abcdefghijKLMNOP123"
    assert template_call_ids("hermes", messages) is messages
