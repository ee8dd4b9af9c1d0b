"""Pure translation of a Messages request into what the core and the chat template take.

Anthropic's conversation becomes the OpenAI-shaped message list that chat templates are written
for: `system` first, `tool_use` blocks as an assistant turn's `tool_calls`, each `tool_result`
as a `tool` turn, `thinking` handed back as `reasoning_content` (templates that render reasoning
read it there; the others ignore it), `redacted_thinking` dropped (its data is opaque to any
model but Claude). A `system` turn in the middle of the conversation stays where it is.

Claude Code's billing block: the first system block of every Claude Code request is
``x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=...;``, which changes from
request to request. It is bookkeeping for Anthropic's API, not an instruction to the model, and
rendered at the very start of the prompt it would defeat prefix caching for the whole
conversation. So a system block (or a system string) that starts with that header is dropped
before rendering: the same conversation renders the same prompt whatever the header says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from gateway.apis.messages.protocol import (
    FileImageSource,
    ImageBlockParam,
    MessageCountTokensRequest,
    MessageParam,
    RedactedThinkingBlockParam,
    TextBlockParam,
    ThinkingAdaptive,
    ThinkingBetweenTools,
    ThinkingBlockParam,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolParam,
    ToolResultBlockParam,
    ToolUseBlockParam,
    UnservedBlockParam,
    URLImageSource,
)
from gateway.core.prompt import template_content
from gateway.errors import InvalidRequestError
from gateway.media import ImageRef

BILLING_HEADER: Final = "x-anthropic-billing-header:"

# Anthropic allows 128 characters; the core's tool handling (and OpenAI's) 64.
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")

# Anthropic's efforts onto the low/medium/high that reasoning templates (gpt-oss) take.
_EFFORT: Final = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}

# Anthropic's minimum thinking budget.
MIN_THINKING_BUDGET: Final = 1024


@dataclass(frozen=True, slots=True)
class Reasoning:
    """What the request asks of the model's reasoning, in neutral terms."""

    # None: the model's default; False: no reasoning; True: reason.
    enabled: bool | None = None
    # low | medium | high, or None for the model's default.
    effort: str | None = None
    # Anthropic's `budget_tokens` (thinking `enabled`).
    budget_tokens: int | None = None

    def template_kwargs(self) -> dict[str, Any]:
        """The chat-template variables reasoning templates read: `enable_thinking` (Qwen 3),
        `thinking` (DeepSeek V3.1) and `reasoning_effort` (gpt-oss). A template that reads
        none of them renders as it always does."""
        out: dict[str, Any] = {}
        if self.enabled is not None:
            out["enable_thinking"] = self.enabled
            out["thinking"] = self.enabled
        if self.effort is not None and self.enabled is not False:
            out["reasoning_effort"] = self.effort
        return out


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A Messages request in the terms the core and the chat template use."""

    messages: list[dict[str, Any]]
    # OpenAI-shaped, as the core's tool planning and chat templates take them.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning: Reasoning = field(default_factory=Reasoning)
    # The conversation's image blocks in prompt order (their places hold the template's image parts).
    images: list[ImageRef] = field(default_factory=list)

    def template_kwargs(self) -> dict[str, Any]:
        return self.reasoning.template_kwargs()


def to_chat(request: MessageCountTokensRequest, *, max_tokens: int | None = None) -> ChatPrompt:
    tools = _tools(request.tools)
    tool_choice, parallel = _tool_choice(request, tools)
    response_format = None
    if request.output_config is not None and request.output_config.format is not None:
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": request.output_config.format.schema_},
        }
    images: list[ImageRef] = []
    return ChatPrompt(
        messages=_system(request.system) + _conversation(request.messages, images),
        images=images,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        response_format=response_format,
        reasoning=_reasoning(request, max_tokens),
    )


def is_billing_header(text: str) -> bool:
    return text.lstrip().startswith(BILLING_HEADER)


def _system(system: str | list[TextBlockParam] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    texts = [system] if isinstance(system, str) else [block.text for block in system]
    texts = [t for t in texts if not is_billing_header(t)]
    if not texts:
        return []
    return [{"role": "system", "content": "\n\n".join(texts)}]


def _unserved(block: UnservedBlockParam, where: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{where}: `{block.type}` content blocks are not supported by this server "
        "(its models take text only).",
        param=where,
    )


def _conversation(messages: list[MessageParam], images: list[ImageRef]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # tool_use ids of the last assistant turn still waiting for their tool_result.
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if message.role == "assistant":
            _append(out, _assistant(message, where))
            open_calls = {c["id"] for c in out[-1].get("tool_calls", ())}
        elif message.role == "system":
            out.append({"role": "system", "content": _text_only(message, where)})
        else:
            for turn in _user(message, where, open_calls, images):
                _append(out, turn)
            open_calls = set()
    return out


def _append(out: list[dict[str, Any]], turn: dict[str, Any]) -> None:
    """Adds a turn, combining it with the one before when both are the same speaker's (user after
    user, assistant after assistant), as Anthropic's API combines consecutive turns: clients such
    as Claude Code send them, and chat templates that insist on alternating roles (Gemma's,
    Llama 2's, Mistral's) would refuse the conversation."""
    last = out[-1] if out else None
    if last is None or last["role"] != turn["role"] or turn["role"] not in ("user", "assistant"):
        out.append(turn)
        return
    last["content"] = _joined(last["content"], turn["content"])
    if "tool_calls" in turn:
        last["tool_calls"] = [*last.get("tool_calls", ()), *turn["tool_calls"]]
    if "reasoning_content" in turn:
        last["reasoning_content"] = last.get("reasoning_content", "") + turn["reasoning_content"]


def _joined(
    first: str | list[dict[str, Any]], second: str | list[dict[str, Any]]
) -> str | list[dict[str, Any]]:
    """Two turns' contents as one: texts a paragraph apart; with images, their parts in order."""
    if isinstance(first, str) and isinstance(second, str):
        return "\n\n".join(t for t in (first, second) if t)

    def parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
        if isinstance(content, str):
            return [{"type": "text", "text": content}] if content else []
        return list(content)

    return parts(first) + parts(second)


def _text_only(message: MessageParam, where: str) -> str:
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, block in enumerate(message.content):
        if isinstance(block, UnservedBlockParam):
            raise _unserved(block, f"{where}.content.{j}")
        if not isinstance(block, TextBlockParam):
            raise InvalidRequestError(
                f"{where}.content.{j}: a `{message.role}` message takes only `text` blocks, "
                f"not `{block.type}`.",
                param=f"{where}.content.{j}",
            )
        texts.append(block.text)
    return "".join(texts)


def _assistant(message: MessageParam, where: str) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content.{j}"
        if isinstance(block, TextBlockParam):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlockParam):
            # Chat templates index into the arguments (Hermes/Qwen write `arguments | tojson`),
            # so they get the object, as the chat completions API gives it.
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.input},
                }
            )
        elif isinstance(block, ThinkingBlockParam):
            thinking.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlockParam):
            continue
        elif isinstance(block, UnservedBlockParam):
            raise _unserved(block, at)
        else:
            raise InvalidRequestError(
                f"{at}: an `assistant` message cannot contain `{block.type}` blocks.", param=at
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        out["reasoning_content"] = "".join(thinking)
    if calls:
        out["tool_calls"] = calls
    return out


def image_ref(block: ImageBlockParam, at: str) -> ImageRef:
    """An image block's source as the media module takes it (a base64 source as a data: URI, its
    declared media type checked there), or a 400 for a Files API source."""
    source = block.source
    if isinstance(source, FileImageSource):
        raise InvalidRequestError(
            f"{at}.source: `file` image sources are not supported by this server (it has no Files API); "
            "send the image as a `base64` or `url` source.",
            param=f"{at}.source",
        )
    if isinstance(source, URLImageSource):
        return ImageRef(source.url, f"{at}.source.url")
    return ImageRef(f"data:{source.media_type};base64,{source.data}", f"{at}.source.data")


def _user(
    message: MessageParam, where: str, open_calls: set[str], images: list[ImageRef]
) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    texts: list[str | ImageRef] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content.{j}"
        if isinstance(block, TextBlockParam):
            texts.append(block.text)
        elif isinstance(block, ImageBlockParam):
            texts.append(image_ref(block, at))
        elif isinstance(block, ToolResultBlockParam):
            if block.tool_use_id not in open_calls:
                raise InvalidRequestError(
                    f"{at}: unexpected `tool_use_id` found in `tool_result` blocks: {block.tool_use_id}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block "
                    "in the previous message.",
                    param=at,
                )
            open_calls.discard(block.tool_use_id)
            if texts:
                out.append({"role": "user", "content": template_content(texts, images)})
                texts = []
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": _result_content(block, at, images),
                }
            )
        elif isinstance(block, UnservedBlockParam):
            raise _unserved(block, at)
        else:
            raise InvalidRequestError(
                f"{at}: a `user` message cannot contain `{block.type}` blocks.", param=at
            )
    if texts or not out:
        out.append({"role": "user", "content": template_content(texts, images)})
    return out


def _result_content(
    block: ToolResultBlockParam, where: str, images: list[ImageRef]
) -> str | list[dict[str, Any]]:
    """A tool_result's content for the template's tool turn: its text, or with image blocks
    (Claude Code's Read of a PNG) text and image parts in order."""
    content = block.content
    parts: list[str | ImageRef] = []
    if isinstance(content, str):
        parts.append(content)
    elif content is not None:
        for k, part in enumerate(content):
            at = f"{where}.content.{k}"
            if isinstance(part, UnservedBlockParam):
                raise _unserved(part, at)
            if isinstance(part, ImageBlockParam):
                parts.append(image_ref(part, at))
            elif isinstance(part, TextBlockParam):
                parts.append(part.text)
            else:
                # Every declared tool is in the prompt, deferred ones too (`defer_loading` is not
                # served), so a reference only needs to name the tool that was found.
                parts.append(f"{part.tool_name}\n")
    # The chat templates' tool turn has no error flag; the model learns it from the text.
    if block.is_error:
        parts.insert(0, "Error: ")
    return template_content(parts, images)


def _tools(tools: list[ToolParam] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools.{i}"
        if tool.type not in (None, "custom"):
            raise InvalidRequestError(
                f"{where}.type: `{tool.type}` is one of Anthropic's server tools, "
                "which this server does not run; "
                "declare client tools with a name and an input_schema.",
                param=f"{where}.type",
            )
        if not _TOOL_NAME.fullmatch(tool.name):
            raise InvalidRequestError(
                f"{where}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'", param=f"{where}.name"
            )
        if tool.name in seen:
            raise InvalidRequestError(
                f"tools: Tool names must be unique ({tool.name!r} repeats).", param="tools"
            )
        seen.add(tool.name)
        if tool.input_schema is None:
            raise InvalidRequestError(f"{where}.input_schema: Field required", param=f"{where}.input_schema")
        if tool.input_schema and tool.input_schema.get("type") != "object":
            raise InvalidRequestError(
                f"{where}.input_schema.type: Input should be 'object'", param=f"{where}.input_schema.type"
            )
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(
    request: MessageCountTokensRequest, tools: list[dict[str, Any]] | None
) -> tuple[str | dict[str, Any] | None, bool | None]:
    choice = request.tool_choice
    if choice is None:
        return None, None
    if isinstance(choice, ToolChoiceNone):
        return "none", None
    parallel = False if choice.disable_parallel_tool_use else None
    names = {t["function"]["name"] for t in tools or ()}
    if not names:
        raise InvalidRequestError(
            f"tool_choice: `{choice.type}` needs `tools` to choose from.", param="tool_choice"
        )
    if isinstance(choice, ToolChoiceTool):
        if choice.name not in names:
            raise InvalidRequestError(
                f"tool_choice.name: tool {choice.name!r} is not in `tools`.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}, parallel
    if isinstance(choice, ToolChoiceAny):
        return "required", parallel
    return "auto", parallel


def _reasoning(request: MessageCountTokensRequest, max_tokens: int | None) -> Reasoning:
    effort = request.output_config.effort if request.output_config is not None else None
    mapped = _EFFORT[effort] if effort is not None else None
    thinking = request.thinking
    if thinking is None:
        return Reasoning(effort=mapped)
    if isinstance(thinking, ThinkingDisabled):
        return Reasoning(enabled=False)
    if isinstance(thinking, ThinkingEnabled):
        if thinking.budget_tokens < MIN_THINKING_BUDGET:
            raise InvalidRequestError(
                f"thinking.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}",
                param="thinking.budget_tokens",
            )
        if max_tokens is not None and thinking.budget_tokens >= max_tokens:
            raise InvalidRequestError(
                "`max_tokens` must be greater than `thinking.budget_tokens`.", param="thinking.budget_tokens"
            )
        return Reasoning(enabled=True, effort=mapped, budget_tokens=thinking.budget_tokens)
    assert isinstance(thinking, ThinkingAdaptive | ThinkingBetweenTools)
    return Reasoning(enabled=True, effort=mapped)
