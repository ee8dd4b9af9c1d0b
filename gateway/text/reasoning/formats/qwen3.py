"""``qwen3``: Qwen3 thinks only when its template lets it.

With ``enable_thinking`` (the default) the template ends the prompt at the assistant turn and
the model writes ``<think>`` itself; thinking-only variants (Qwen3-*-Thinking-2507) end the prompt
with ``<think>``; with ``enable_thinking: false`` the prompt holds an empty, closed block. So the
reply is the answer unless it starts with ``<think>`` or the prompt opened the block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.text.reasoning.base import ReasoningFormat, ReasoningParser
from gateway.text.reasoning.think import MARKERS, ThinkParser, prompt_state


def _parser(
    prompt: str, marker_ids: Mapping[str, int], make_id: Callable[[], str], encoding: object
) -> ReasoningParser:
    return ThinkParser(starts_in_reasoning=prompt_state(prompt) is True, marker_ids=marker_ids)


FORMAT = ReasoningFormat(name="qwen3", keeps_special_tokens=False, markers=MARKERS, factory=_parser)
