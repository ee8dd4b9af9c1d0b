"""What a request asks of a reasoning model, as the chat-template variables reasoning templates
read: OpenAI's `reasoning_effort` (chat) and `reasoning.effort` (Responses) in one place."""

from __future__ import annotations

from typing import Any, Final

# OpenAI's efforts onto the low / medium / high that reasoning templates take (gpt-oss's
# `reasoning_effort`); "none" is thinking switched off (see effort_template_kwargs).
_EFFORTS: Final = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def effort_template_kwargs(effort: str | None) -> dict[str, Any]:
    """The template variables for a reasoning effort: `reasoning_effort` (gpt-oss), or for "none"
    thinking off, as Qwen 3 (`enable_thinking`) and DeepSeek V3.1 (`thinking`) read it. A template
    that reads none of them renders as it always does."""
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False, "thinking": False}
    return {"reasoning_effort": _EFFORTS.get(effort, effort)}
