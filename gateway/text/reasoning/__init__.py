"""Reasoning models: splitting a reply into the model's thinking, its answer and (gpt-oss) its tool
calls, streamed token by token or whole. Pure (no tokenizer, no I/O) but for what a format loads
from a model's files once at start-up (`ReasoningFormat.load`).

Formats (one module each under `formats/`, listed in `registry`): ``deepseek_r1`` and ``qwen3`` (a
``<think>`` ... ``</think>`` block, also when the chat template opened it in the prompt) and
``gpt_oss`` (the harmony channels, read by ``openai-harmony``'s parser with the o200k-harmony
encoding built from the model's own tokenizer.json at start-up; details in `gpt_oss`).

The parsers read text: the markers of the think formats are added tokens that a default decode
keeps, and harmony's are special tokens, so a gpt_oss model's output is decoded with special
tokens kept (`ReasoningFormat.keeps_special_tokens`) and re-encoded for the library. The engine's
ids are used only to count `reasoning_tokens` (usage's ``output_tokens_details.reasoning_tokens``)
exactly.

Wiring, per choice: ``fmt = get_format(name)`` once per model (None for ``"none"``), with
``ids = fmt.marker_ids(vocab)`` and, for a format with a `load` (gpt_oss),
``encoding = fmt.load(tokenizer_dir, cache_dir)``; decode the output with special tokens kept when
``fmt.keeps_special_tokens``;
``parser = fmt.parser(prompt=rendered_prompt, marker_ids=ids, encoding=encoding)``; then
``parser.feed(text_delta, new_token_ids)`` each step and ``parser.finish()`` at the end.
The content events go on to the model's tool-call parser (think formats); gpt_oss reports its
calls itself. `parse_reasoning` is the same parser fed the whole reply at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.text.reasoning.base import (
    ReasoningDelta,
    ReasoningEvent,
    ReasoningFormat,
    ReasoningOutput,
    ReasoningParser,
)
from gateway.text.reasoning.registry import FORMATS, MODEL_FORMATS, check_format, get_format
from gateway.text.tool_calls import ContentDelta, ToolCall, ToolCallStart, new_tool_call_id


def parse_reasoning(
    text: str,
    format: str | ReasoningFormat,
    *,
    prompt: str = "",
    token_ids: Sequence[int] = (),
    marker_ids: Mapping[str, int] | None = None,
    make_id: Callable[[], str] = new_tool_call_id,
    encoding: Any = None,
) -> ReasoningOutput:
    """The reasoning, content and tool calls of a complete reply (`token_ids`: the ids it was
    decoded from, for `reasoning_tokens`; `encoding`: the format's, see `ReasoningFormat.load`)."""
    fmt = get_format(format) if isinstance(format, str) else format
    if fmt is None:
        return ReasoningOutput(None, text, (), 0)
    parser = fmt.parser(prompt=prompt, marker_ids=marker_ids, make_id=make_id, encoding=encoding)
    events = parser.feed(text, token_ids) + parser.finish()
    reasoning: list[str] = []
    content: list[str] = []
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ToolCallStart):
            names[event.index] = (event.id, event.name)
        else:
            arguments.setdefault(event.index, []).append(event.arguments)
    calls = tuple(
        ToolCall(call_id, name, "".join(arguments.get(index, ())))
        for index, (call_id, name) in sorted(names.items())
    )
    return ReasoningOutput("".join(reasoning) or None, "".join(content), calls, parser.reasoning_tokens)


__all__ = [
    "FORMATS",
    "MODEL_FORMATS",
    "ReasoningDelta",
    "ReasoningEvent",
    "ReasoningFormat",
    "ReasoningOutput",
    "ReasoningParser",
    "check_format",
    "get_format",
    "parse_reasoning",
]
