"""``deepseek_r1``: DeepSeek-R1 and its distillations always think first.

The reply starts inside the think block whether or not the chat template wrote ``<think>``
(older R1 templates leave it to the model, which then writes it; it is consumed). A reply with
no ``</think>`` was cut while thinking: all of it is reasoning, as vLLM reads it. A prompt that
ends with a closed block (thinking switched off by the template) starts in the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.text.reasoning.base import ReasoningFormat, ReasoningParser
from gateway.text.reasoning.think import MARKERS, ThinkParser, prompt_state


def _parser(
    prompt: str, marker_ids: Mapping[str, int], make_id: Callable[[], str], encoding: object
) -> ReasoningParser:
    state = prompt_state(prompt)
    return ThinkParser(starts_in_reasoning=state is not False, marker_ids=marker_ids)


FORMAT = ReasoningFormat(name="deepseek_r1", keeps_special_tokens=False, markers=MARKERS, factory=_parser)
