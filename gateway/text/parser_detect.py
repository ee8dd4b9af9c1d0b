"""Which tool-call and reasoning parser fit a model, from its vocabulary and chat template: the
markers a family writes are its own tokens (DeepSeek's ``<｜tool▁calls▁begin｜>``, Mistral's
``[TOOL_CALLS]``, harmony's ``<|channel|>``), and the template shows how calls and thinking are
written back (Qwen3-Coder's ``<function=``, Llama 3.1's ``"parameters"``, ``enable_thinking``).
Used by ``gateway check`` and at start-up to name the setting a model is missing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

_HARMONY: Final = ("<|start|>", "<|channel|>", "<|message|>", "<|call|>")
_DEEPSEEK_CALLS: Final = "<｜tool▁calls▁begin｜>"
_MISTRAL_CALLS: Final = "[TOOL_CALLS]"
_HERMES_CALL: Final = "<tool_call>"
_THINK: Final = ("<think>", "</think>")


class TokenizerLike(Protocol):
    @property
    def vocab(self) -> Mapping[str, int]: ...

    @property
    def chat_template(self) -> str | None: ...


def suggest_parsers(tokenizer: TokenizerLike) -> tuple[str | None, str | None]:
    """The fitting ``tool_parser`` and ``reasoning_parser`` (vLLM's names; None where nothing fits)."""
    vocab = tokenizer.vocab
    template = tokenizer.chat_template or ""
    return _tool_parser(vocab, template), _reasoning_parser(vocab, template)


def _harmony(vocab: Mapping[str, int], template: str) -> bool:
    """Harmony's tokens, and a template that writes channels (a vocabulary may hold harmony's
    tokens beside a template of another format: the dev stack's agent model does)."""
    return all(marker in vocab for marker in _HARMONY) and (not template or "<|channel|>" in template)


def _tool_parser(vocab: Mapping[str, int], template: str) -> str | None:
    if _harmony(vocab, template):
        return "openai"
    if _DEEPSEEK_CALLS in vocab:
        return "deepseek_v3"
    if _MISTRAL_CALLS in vocab:
        return "mistral"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if _HERMES_CALL in vocab or _HERMES_CALL in template:
        return "hermes"
    # Llama 3.1-3.3: a template that renders tools and writes calls as {"name": ..., "parameters": ...}.
    if "<|start_header_id|>" in vocab and "tools" in template and '"parameters"' in template:
        return "llama3_json"
    return None


def _reasoning_parser(vocab: Mapping[str, int], template: str) -> str | None:
    if _harmony(vocab, template):
        return "gpt_oss"
    if not all(marker in vocab for marker in _THINK):
        return None
    if "enable_thinking" in template:
        return "qwen3"
    if _opens_think(template):
        # The prompt ends inside the think block (DeepSeek-R1 and its distillations): always thinks.
        return "deepseek_r1"
    if any(marker in template for marker in _THINK):
        return "qwen3"
    return None


def _opens_think(template: str) -> bool:
    """Whether the template's generation prompt ends with ``<think>``."""
    at = template.rfind("add_generation_prompt")
    return at != -1 and "<think>" in template[at:]
