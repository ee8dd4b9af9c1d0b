"""/v1/messages over the generation core: a Messages request through the chat template into one
engine request, and the reply back as Anthropic content, whole or as its event stream."""

from __future__ import annotations

import random
import secrets
import string
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import tracing
from gateway.apis.messages import errors
from gateway.apis.messages.protocol import (
    Message,
    MessageCountTokensRequest,
    MessageCreateRequest,
    MessageTokensCount,
)
from gateway.apis.messages.stream import MessageAssembler, MessageStreamWriter, ReplyRouter, stop_reason
from gateway.apis.messages.translate import ChatPrompt, to_chat
from gateway.core import validation as v
from gateway.core.generation import (
    GenerationService,
    PreparedRequest,
    affinity_key,
    build_generation,
    events,
    reserve_quota,
    stream_failure,
)
from gateway.core.models import ModelRuntime
from gateway.core.output import OutputPlan, plan_output
from gateway.core.prompt import Prompt, chat_prompt, check_images, template_messages
from gateway.engine import SamplingParams
from gateway.logs import current_request

_ID_ALPHABET = string.ascii_letters + string.digits


def _note_ignored(extra: dict[str, object] | None) -> None:
    """Fields Anthropic defines that the gateway does not use (`context_management`, betas'
    fields) are accepted, as the Messages API must for agents; the access log and the
    `x-gateway-ignored-fields` header name them."""
    record = current_request.get()
    if record is not None and extra:
        record.ignored_fields = tuple(extra)


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def new_tool_use_id() -> str:
    """Shaped like Anthropic's: ``toolu_`` and 24 random letters and digits."""
    return "toolu_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    """A Messages request ready to run: the core's prepared request and how to show thinking."""

    prepared: PreparedRequest
    # False when the client asked for thinking to be omitted (`thinking.display: "omitted"`).
    show_thinking: bool = True


class MessagesService(GenerationService):
    async def _render(
        self, runtime: ModelRuntime, chat: ChatPrompt, structured_outputs: dict[str, Any] | None = None
    ) -> tuple[Prompt, OutputPlan]:
        plan = plan_output(
            tools=chat.tools,
            tool_choice=chat.tool_choice,
            parallel_tool_calls=chat.parallel_tool_calls,
            response_format=chat.response_format,
            structured_outputs=structured_outputs,
            model_tool_format=runtime.config.tool_parser,
            guided_decoding=runtime.engine.info.guided_decoding,
            template_renders_tools=runtime.tokenizer.renders_tools,
        )
        kwargs = chat.template_kwargs()
        if plan.template_tools is not None:
            kwargs["tools"] = plan.template_tools
        messages = template_messages(runtime, chat.messages)
        check_images(runtime, chat.images, "image")
        images = await self._media.load_images(chat.images)
        with tracing.span("tokenize", model=runtime.name):
            rendered = await runtime.tokenizer.render_chat(messages, **kwargs)
            return chat_prompt(runtime, rendered, images, messages), plan

    async def prepare(
        self,
        body: MessageCreateRequest,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        session: str | None = None,
    ) -> PreparedMessage:
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        _note_ignored(body.model_extra)
        chat = to_chat(body, max_tokens=body.max_tokens)
        stops = v.stop_strings(body.stop_sequences, self._limits)
        prompt, plan = await self._render(runtime, chat, body.structured_outputs)
        ids, max_tokens = await self._budget(runtime, prompt, body.max_tokens)
        message_id = new_message_id()
        # Without a temperature the engine's own defaults sample; a fresh seed keeps TensorRT-LLM
        # (default seed 0) from sampling the same text for every request.
        sampling = body.temperature is None or body.temperature > 0
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=random.getrandbits(63) if sampling else None,
            ignore_eos=bool(body.ignore_eos),
        )
        generation = build_generation(
            runtime,
            request_id=message_id,
            prompt=prompt,
            prompt_ids=ids,
            params=params,
            num_sequences=1,
            stops=stops,
            first_index=0,
            guide=plan.guide,
            # Anthropic's end-user id (Claude Code's names its session): prefix routing keeps the
            # conversation on one replica.
            affinity=affinity_key(
                prompt_cache_key=None,
                session=session,
                safety_identifier=None,
                user=body.metadata.user_id if body.metadata is not None else None,
            ),
            reasoning=True,
            tool_format=plan.tool_format,
            priority=priority,
        )
        prepared = PreparedRequest(
            runtime,
            [generation],
            message_id,
            timeout_s=v.request_deadline(self._limits, timeout_s),
            tool_format=plan.tool_format,
            tool_names=plan.tool_names,
            tool_parameters=plan.tool_parameters,
            forced=plan.forced,
            forced_name=plan.forced_name,
        )
        await reserve_quota(prepared)
        display = getattr(body.thinking, "display", None)
        return PreparedMessage(prepared, show_thinking=display != "omitted")

    async def _budget(
        self, runtime: ModelRuntime, prompt: Prompt, requested: int
    ) -> tuple[Sequence[int] | None, int]:
        """The prompt's ids and max_tokens. Agents ask for more than a small context holds
        (Claude Code: 32000), and Anthropic's API takes `max_tokens` as a ceiling, so it is
        clamped to what the context (and the server's limit) leaves; a reply cut there ends
        with stop_reason "max_tokens". A prompt that leaves no room at all is still a 400."""
        limits = self._limits
        if limits.max_tokens is not None:
            requested = min(requested, limits.max_tokens)
        if runtime.max_model_len is None:
            return await v.prompt_budget(
                runtime,
                prompt,
                requested=requested,
                param="max_tokens",
                prompt_param="messages",
                limits=limits,
            )
        return await v.prompt_budget(
            runtime,
            prompt,
            requested=None,
            param="max_tokens",
            prompt_param="messages",
            limits=limits,
            ceiling=requested,
        )

    async def count_tokens(self, body: MessageCountTokensRequest) -> MessageTokensCount:
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        _note_ignored(body.model_extra)
        prompt, _ = await self._render(runtime, to_chat(body))
        # Counted as the engine sees it, each image as the model's processor expands it.
        text, add_special_tokens = v.counted_prompt(runtime, prompt)
        ids = await runtime.tokenizer.encode_async(text, add_special_tokens=add_special_tokens)
        return MessageTokensCount(input_tokens=len(ids))

    def _router(
        self, prepared: PreparedRequest, sink: MessageStreamWriter | MessageAssembler, *, show_thinking: bool
    ) -> ReplyRouter:
        parser = prepared.reply_parsers(make_id=new_tool_use_id).get(0)
        return ReplyRouter(sink, parser, show_thinking=show_thinking)

    async def create(self, message: PreparedMessage) -> Message:
        prepared = message.prepared
        assembler = MessageAssembler()
        reply = self._router(prepared, assembler, show_thinking=message.show_thinking)
        finish = "stop"
        async for event in events(prepared, self._metrics):
            reply.text(event.text, event.token_ids)
            if event.finish_reason is not None:
                finish = event.finish_reason
        reply.finish()
        stop = prepared.choices[0].stop_sequence
        return assembler.message(
            prepared.response_id,
            prepared.runtime.name,
            stop_reason(finish, tool_calls=reply.tool_calls, stop_sequence=stop),
            stop,
            prompt_tokens=prepared.prompt_tokens,
            output_tokens=prepared.completion_tokens,
            cached_tokens=prepared.cached_tokens,
        )

    async def stream(self, message: PreparedMessage) -> AsyncGenerator[bytes, None]:
        prepared = message.prepared
        writer = MessageStreamWriter(prepared.response_id, prepared.runtime.name)
        reply = self._router(prepared, writer, show_thinking=message.show_thinking)
        try:
            # message_start waits for the engine's first response: Anthropic's carries the prompt's
            # cache reads, and only the engine knows how much of the prompt it reused (keep-alive
            # pings, which the SDKs skip, may come before it).
            started = False
            finish = "stop"
            async for event in events(prepared, self._metrics):
                frames = reply.text(event.text, event.token_ids)
                if not started:
                    started = True
                    await prepared.count_prompts()
                    frames = writer.start(prepared.prompt_tokens, prepared.cached_tokens) + frames
                if event.finish_reason is not None:
                    finish = event.finish_reason
                if frames:
                    yield frames
            frames = reply.finish()
            if not started:
                await prepared.count_prompts()
                frames = writer.start(prepared.prompt_tokens, prepared.cached_tokens) + frames
            stop = prepared.choices[0].stop_sequence
            reason = stop_reason(finish, tool_calls=reply.tool_calls, stop_sequence=stop)
            yield frames + writer.finish(
                reason,
                stop,
                prompt_tokens=prepared.prompt_tokens,
                output_tokens=prepared.completion_tokens,
                cached_tokens=prepared.cached_tokens,
            )
        except Exception as exc:
            yield errors.error_event(stream_failure(exc))
