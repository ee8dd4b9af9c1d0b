"""/v1/chat/completions: messages through the chat template -> one prompt -> n choices, and the
choices back as a chat.completion or a chunk stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

from gateway import tracing
from gateway.apis.chat_completions.logprobs import chat_logprobs
from gateway.apis.chat_completions.protocol import (
    OPENAI_FIELDS,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatMessageIn,
    ImageContentPart,
    TextContentPart,
)
from gateway.apis.chat_completions.stream import ChatChunkWriter
from gateway.apis.openai.fields import check_stream_options, ignored_fields, note_ignored_fields
from gateway.apis.openai.protocol import CompletionUsage
from gateway.apis.openai.sse import DONE, error_event
from gateway.core import validation as v
from gateway.core.generation import (
    GenerationService,
    PreparedRequest,
    affinity_key,
    build_generation,
    events,
    new_id,
    reserve_quota,
    stream_failure,
)
from gateway.core.output import plan_output
from gateway.core.prompt import (
    chat_prompt,
    check_images,
    template_arguments,
    template_content,
    template_messages,
)
from gateway.core.reasoning import effort_template_kwargs
from gateway.engine import TokenLogprob
from gateway.errors import InvalidRequestError
from gateway.media import ImageRef
from gateway.text.reasoning import ReasoningDelta
from gateway.text.reply import ReplyCollector, ReplyEvent, ReplyParser
from gateway.text.tool_calls import ContentDelta, finish_reason


class ChatCompletionsService(GenerationService):
    async def prepare(
        self,
        body: ChatCompletionRequest,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        priority: int = 0,
    ) -> PreparedRequest:
        note_ignored_fields(ignored_fields(body, OPENAI_FIELDS, strict=self._limits.reject_unknown_fields))
        check_stream_options(body.stream, body.stream_options)
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        n = v.choose_n(body.n, self._limits)
        stops = v.stop_strings(body.stop, self._limits)
        plan = plan_output(
            tools=body.tools,
            tool_choice=body.tool_choice,
            parallel_tool_calls=body.parallel_tool_calls,
            response_format=body.response_format,
            structured_outputs=body.structured_outputs,
            model_tool_format=runtime.config.tool_parser,
            guided_decoding=runtime.engine.info.guided_decoding,
        )
        refs: list[ImageRef] = []
        messages = template_messages(
            runtime, [_template_message(m, i, refs) for i, m in enumerate(body.messages)]
        )
        check_images(runtime, refs, "image_url")
        images = await self._media.load_images(refs)
        template_kwargs = dict(body.chat_template_kwargs or {})
        for key, value in effort_template_kwargs(body.reasoning_effort).items():
            # The client's chat_template_kwargs say it more precisely, if they say it.
            template_kwargs.setdefault(key, value)
        if plan.template_tools is not None:
            template_kwargs["tools"] = plan.template_tools
        requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        with tracing.span("tokenize", model=runtime.name):
            prompt = chat_prompt(
                runtime, await runtime.tokenizer.render_chat(messages, **template_kwargs), images, messages
            )
            ids, max_tokens = await v.prompt_budget(
                runtime,
                prompt,
                requested=requested,
                param=param,
                prompt_param="messages",
                limits=self._limits,
            )
        logprobs, bias = v.token_options(
            runtime,
            logprobs=bool(body.logprobs),
            top_logprobs=body.top_logprobs,
            top_param="top_logprobs",
            logit_bias=body.logit_bias,
        )
        response_id = new_id("chatcmpl")
        generation = build_generation(
            runtime,
            request_id=response_id,
            prompt=prompt,
            prompt_ids=ids,
            params=v.sampling_params(body, max_tokens),
            num_sequences=n,
            stops=stops,
            first_index=0,
            guide=plan.guide,
            logprobs=logprobs,
            logit_bias=bias,
            affinity=affinity_key(
                prompt_cache_key=body.prompt_cache_key,
                session=session,
                safety_identifier=body.safety_identifier,
                user=body.user,
            ),
            stream=bool(body.stream),
            reasoning=True,
            tool_format=plan.tool_format,
            priority=priority,
        )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        prepared = PreparedRequest(
            runtime,
            [generation],
            response_id,
            include_usage=include_usage,
            timeout_s=v.request_deadline(self._limits, timeout_s),
            client_deadline=v.client_chose_deadline(self._limits, timeout_s),
            tool_format=plan.tool_format,
            tool_names=plan.tool_names,
            tool_parameters=plan.tool_parameters,
            forced=plan.forced,
            forced_name=plan.forced_name,
            logprobs=logprobs,
        )
        await reserve_quota(prepared)
        return prepared

    async def create(self, prepared: PreparedRequest) -> ChatCompletion:
        parsers = prepared.reply_parsers()
        replies = {index: ReplyCollector() for index in parsers}
        texts = {c.index: "" for c in prepared.choices}
        reasons: dict[int, str] = {}
        entries: dict[int, list[TokenLogprob]] = {c.index: [] for c in prepared.choices}
        async for event in events(prepared, self._metrics):
            parser = parsers.get(event.index)
            if parser is None:
                texts[event.index] += event.text
            else:
                reply = replies[event.index]
                reply.add(parser.feed(event.text, event.token_ids))
                if event.finish_reason is not None:
                    reply.add(parser.finish())
            entries[event.index] += event.logprobs
            if event.finish_reason is not None:
                reasons[event.index] = event.finish_reason
        tokenizer = prepared.runtime.tokenizer
        prompt, completion = prepared.prompt_tokens, prepared.completion_tokens
        choices = []
        for i in sorted(texts):
            message = ChatCompletionMessage(content=texts[i])
            reason = reasons[i]
            if i in replies:
                parsed = replies[i].reply()
                calls = [c.to_openai() for c in parsed.tool_calls]
                message = ChatCompletionMessage(
                    # null, as OpenAI sends it, when the reply was only tool calls.
                    content=parsed.content if parsed.content or not calls else None,
                    reasoning_content=parsed.reasoning,
                    tool_calls=calls or None,
                )
                reason = finish_reason(reason, len(calls))
            logprobs = chat_logprobs(tokenizer, entries[i]) if prepared.logprobs is not None else None
            choices.append(
                ChatCompletionChoice(index=i, message=message, finish_reason=reason, logprobs=logprobs)  # type: ignore[arg-type]
            )
        return ChatCompletion(
            id=prepared.response_id,
            created=prepared.created,
            model=prepared.runtime.name,
            choices=choices,
            usage=CompletionUsage.of(
                prompt, completion, prepared.cached_tokens, _reasoning_tokens(prepared, parsers)
            ),
        )

    async def stream(self, prepared: PreparedRequest) -> AsyncGenerator[bytes, None]:
        writer = ChatChunkWriter(
            prepared.response_id,
            prepared.created,
            prepared.runtime.name,
            include_usage=prepared.include_usage,
        )
        parsers = prepared.reply_parsers()
        # Log probabilities of tokens whose text a parser still holds back, by choice.
        held: dict[int, list[TokenLogprob]] = {}
        try:
            for choice in prepared.choices:
                yield writer.role(choice.index)
            async for event in events(prepared, self._metrics):
                parser = parsers.get(event.index)
                if parser is None:
                    if event.text or event.logprobs:
                        logprobs = None
                        if prepared.logprobs is not None:
                            logprobs = chat_logprobs(prepared.runtime.tokenizer, event.logprobs)
                        yield writer.content(event.index, event.text, logprobs)
                    if event.finish_reason is not None:
                        yield writer.finish(event.index, event.finish_reason)
                    continue
                pieces = parser.feed(event.text, event.token_ids)
                if event.finish_reason is not None:
                    pieces += parser.finish()
                entries = event.logprobs
                if prepared.logprobs is not None and (entries or event.index in held):
                    entries = (*held.pop(event.index, ()), *entries)
                    if not pieces and event.finish_reason is None:
                        held[event.index] = list(entries)
                        entries = ()
                for chunk in _reply_chunks(writer, event.index, pieces, prepared, entries):
                    yield chunk
                if event.finish_reason is not None:
                    yield writer.finish(event.index, finish_reason(event.finish_reason, parser.tool_calls))
            if prepared.include_usage:
                yield writer.usage(
                    prepared.prompt_tokens,
                    prepared.completion_tokens,
                    prepared.cached_tokens,
                    _reasoning_tokens(prepared, parsers),
                )
        except Exception as exc:
            yield error_event(stream_failure(exc))
        yield DONE


def _reasoning_tokens(prepared: PreparedRequest, parsers: dict[int, ReplyParser]) -> int | None:
    """Usage's `completion_tokens_details.reasoning_tokens`: only for a model with a reasoning parser."""
    if all(g.reasoning is None for g in prepared.generations):
        return None
    return sum(parser.reasoning_tokens for parser in parsers.values())


def _reply_chunks(
    writer: ChatChunkWriter,
    index: int,
    pieces: list[ReplyEvent],
    prepared: PreparedRequest,
    entries: Sequence[TokenLogprob],
) -> list[bytes]:
    """The chunks of one event's reply pieces; its tokens' log probabilities (when asked for) go
    with the first text chunk, or alone in an empty content chunk when there is none."""
    logprobs = None
    if prepared.logprobs is not None and entries:
        logprobs = chat_logprobs(prepared.runtime.tokenizer, entries)
    out = []
    for item in pieces:
        if isinstance(item, ContentDelta):
            if item.text:
                out.append(writer.content(index, item.text, logprobs))
                logprobs = None
        elif isinstance(item, ReasoningDelta):
            if item.text:
                out.append(writer.reasoning(index, item.text, logprobs))
                logprobs = None
        else:
            out.append(writer.tool_calls(index, [item.to_openai()]))
    if logprobs is not None:
        out.append(writer.content(index, "", logprobs))
    return out


def _template_message(message: ChatMessageIn, position: int, images: list[ImageRef]) -> dict[str, Any]:
    """The message as its chat template takes it; its image parts (user messages only, as in
    OpenAI's API) become image parts in place, their references appended to `images`."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
    content: str | list[dict[str, Any]] | None = None
    if isinstance(message.content, list):
        parts: list[str | ImageRef] = []
        for j, part in enumerate(message.content):
            at = f"messages[{position}].content[{j}]"
            if isinstance(part, TextContentPart):
                parts.append(part.text)
            elif isinstance(part, ImageContentPart) and message.role == "user":
                parts.append(ImageRef(part.image_url.url, f"{at}.image_url.url"))
            elif isinstance(part, ImageContentPart):
                raise InvalidRequestError(
                    f"content parts of type `image_url` are only accepted in user messages, "
                    f"not in a `{message.role}` message",
                    param=at,
                )
            else:
                raise InvalidRequestError(
                    f"content parts of type `{part.type}` are not supported by this model",
                    param=f"messages[{position}].content",
                )
        content = template_content(parts, images)
    else:
        content = message.content
    out["content"] = content if content is not None else ""
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        # Chat templates index into the arguments (Hermes/Qwen write `arguments | tojson`), so
        # they get the object OpenAI clients sent as a JSON string.
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": template_arguments(c.function.arguments)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    thought = message.reasoning_content if message.reasoning_content is not None else message.reasoning
    if thought is not None and message.role == "assistant":
        out["reasoning_content"] = thought
    return out
