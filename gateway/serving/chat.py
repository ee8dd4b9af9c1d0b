"""/v1/chat/completions: messages through the chat template -> one prompt -> n choices."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from gateway.errors import InvalidRequestError, to_gateway_error
from gateway.metrics import GatewayMetrics
from gateway.protocol.openai import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionUsage,
    TextContentPart,
)
from gateway.serving import params as p
from gateway.serving.base import PreparedRequest, build_generation, events, new_id
from gateway.serving.chunks import DONE, ChatChunkWriter, error_event
from gateway.serving.registry import ModelRegistry

logger = logging.getLogger(__name__)


class ChatService:
    def __init__(
        self, registry: ModelRegistry, limits: p.RequestLimits, metrics: GatewayMetrics | None
    ) -> None:
        self._registry = registry
        self._limits = limits
        self._metrics = metrics

    def prepare(self, body: ChatCompletionRequest, *, timeout_s: float | None = None) -> PreparedRequest:
        runtime = self._registry.get(body.model)
        p.log_unknown_fields(body.model_extra)
        p.reject_unsupported(body)
        n = p.choose_n(body.n, self._limits)
        stops = p.stop_strings(body.stop, self._limits)
        messages = [_template_message(m, i) for i, m in enumerate(body.messages)]
        prompt = runtime.tokenizer.apply_chat_template(messages, **(body.chat_template_kwargs or {}))
        # Chat templates write BOS themselves; the stock preprocessing still adds special tokens,
        # and the count must match what the engine sees.
        ids = runtime.tokenizer.encode(prompt, add_special_tokens=runtime.config.add_special_tokens)
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_tokens = p.resolve_max_tokens(
            requested, len(ids), runtime.max_model_len, param=param, limits=self._limits
        )
        response_id = new_id("chatcmpl")
        generation = build_generation(
            runtime,
            request_id=response_id,
            prompt_text=prompt,
            prompt_ids=ids,
            params=p.sampling_params(body, max_tokens, n),
            n=n,
            stops=stops,
            first_index=0,
        )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return PreparedRequest(
            runtime,
            [generation],
            response_id,
            include_usage=include_usage,
            timeout_s=p.request_deadline(self._limits, timeout_s),
        )

    async def create(self, prepared: PreparedRequest) -> ChatCompletion:
        texts = {c.index: "" for c in prepared.choices}
        reasons: dict[int, Any] = {}
        async for event in events(prepared, self._metrics):
            texts[event.index] += event.text
            if event.finish_reason is not None:
                reasons[event.index] = event.finish_reason
        prompt, completion = prepared.prompt_tokens, prepared.completion_tokens
        return ChatCompletion(
            id=prepared.response_id,
            created=prepared.created,
            model=prepared.runtime.name,
            choices=[
                ChatCompletionChoice(
                    index=i, message=ChatCompletionMessage(content=texts[i]), finish_reason=reasons[i]
                )
                for i in sorted(texts)
            ],
            usage=CompletionUsage(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
            ),
        )

    async def stream(self, prepared: PreparedRequest) -> AsyncIterator[str]:
        writer = ChatChunkWriter(
            prepared.response_id,
            prepared.created,
            prepared.runtime.name,
            include_usage=prepared.include_usage,
        )
        try:
            for choice in prepared.choices:
                yield writer.role(choice.index)
            async for event in events(prepared, self._metrics):
                if event.text:
                    yield writer.content(event.index, event.text)
                if event.finish_reason is not None:
                    yield writer.finish(event.index, event.finish_reason)
            if prepared.include_usage:
                yield writer.usage(prepared.prompt_tokens, prepared.completion_tokens)
        except Exception as exc:
            error = to_gateway_error(exc)
            logger.log(logging.ERROR if error.status_code >= 500 else logging.INFO, "stream failed: %s", exc)
            yield error_event(error)
        yield DONE


def _template_message(message: ChatMessageIn, position: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, TextContentPart):
                raise InvalidRequestError(
                    f"content parts of type `{part.type}` are not supported by this model",
                    param=f"messages[{position}].content",
                )
            texts.append(part.text)
        content = "".join(texts)
    out["content"] = content if content is not None else ""
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out
