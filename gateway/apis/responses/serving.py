"""/v1/responses over the same generation path as chat completions: input items and instructions
through the chat template, tools and text.format through the core's output planning, the reply
through the tool-call parser into output items; stored responses and sealed reasoning."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import tracing
from gateway.apis.openai.fields import ignored_fields, note_ignored_fields
from gateway.apis.openai.logprobs import token_string
from gateway.apis.responses import items as it
from gateway.apis.responses.protocol import (
    INPUT_TOKENS_FIELDS,
    OPENAI_FIELDS,
    CreateResponseRequest,
    InputItem,
    InputTokens,
    InputTokensRequest,
    Reasoning,
    Response,
    ResponseDeleted,
    ResponseItemList,
)
from gateway.apis.responses.resources import page, resolve_references, resource
from gateway.apis.responses.sealing import ReasoningSealer, load_or_create_key, parse_key
from gateway.apis.responses.stream import ResponseBuilder, new_item_id
from gateway.apis.responses.tools import ToolPlan, plan_tools, response_format
from gateway.config import Settings
from gateway.core.generation import (
    GenerationService,
    PreparedRequest,
    affinity_key,
    build_generation,
    events,
    reserve_quota,
)
from gateway.core.models import ModelRegistry, ModelRuntime
from gateway.core.output import OutputPlan, plan_output
from gateway.core.prompt import Prompt, chat_prompt, check_images, template_messages
from gateway.core.reasoning import effort_template_kwargs
from gateway.core.validation import (
    RequestLimits,
    engine_prompt,
    prompt_budget,
    prompt_budget_now,
    request_deadline,
    stop_strings,
    token_options,
)
from gateway.engine import ImageInput, SamplingParams, TokenLogprob
from gateway.errors import (
    ContextLengthExceededError,
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    UnsupportedParameterError,
    to_gateway_error,
)
from gateway.media import ImageRef, MediaConnector
from gateway.metrics import GatewayMetrics
from gateway.store import ResponseStore, StoredResponse, StoreSettings, open_store
from gateway.text.reasoning import ReasoningDelta
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls import ContentDelta, ToolCallStart

logger = logging.getLogger(__name__)

_logged_skipped: set[str] = set()
# The core names chat's fields in its errors; these are their Responses names.
_PARAMS = {
    "response_format": "text.format",
    "response_format.type": "text.format.type",
    "response_format.json_schema": "text.format.schema",
    "messages": "input",
    "prompt": "input",
    "max_tokens": "max_output_tokens",
}
LOGPROBS_INCLUDE = "message.output_text.logprobs"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"


@dataclass(slots=True)
class PreparedResponse:
    body: CreateResponseRequest
    prepared: PreparedRequest
    tools: ToolPlan
    # The response as it starts (status in_progress), every request field echoed.
    start: dict[str, Any]
    # The whole conversation the model sees, as stored items (earlier turns included).
    conversation: list[dict[str, Any]]
    seal: bool


@dataclass(slots=True)
class _Prompt:
    runtime: ModelRuntime
    prompt: Prompt
    ids: Sequence[int] | None
    max_tokens: int
    plan: OutputPlan
    tools: ToolPlan
    conversation: list[dict[str, Any]]


def _renamed(exc: GatewayError) -> GatewayError:
    if exc.param in _PARAMS:
        exc.param = _PARAMS[exc.param]
    return exc


class ResponsesService(GenerationService):
    def __init__(
        self,
        registry: ModelRegistry,
        limits: RequestLimits,
        metrics: GatewayMetrics | None,
        *,
        store: Callable[[], ResponseStore],
        sealer: Callable[[], ReasoningSealer],
        strict_tools: bool = False,
        media: MediaConnector | None = None,
    ) -> None:
        super().__init__(registry, limits, metrics, media=media)
        # Both are opened on first use: a gateway nobody asks for stored responses or sealed
        # reasoning writes nothing to its state directory.
        self._open_store = store
        self._open_sealer = sealer
        self._store_instance: ResponseStore | None = None
        self._sealer_instance: ReasoningSealer | None = None
        self._strict_tools = strict_tools

    @classmethod
    def build(
        cls,
        registry: ModelRegistry,
        limits: RequestLimits,
        metrics: GatewayMetrics | None,
        settings: Settings,
    ) -> ResponsesService:
        store_settings = StoreSettings(
            settings.state_dir,
            settings.response_store_max_age_s,
            settings.response_store_max_count,
            settings.state_url,
        )

        def sealer() -> ReasoningSealer:
            key = settings.reasoning_encryption_key
            return ReasoningSealer(parse_key(key) if key else load_or_create_key(settings.state_dir))

        return cls(
            registry,
            limits,
            metrics,
            store=lambda: open_store(settings.response_store, store_settings),
            sealer=sealer,
            strict_tools=settings.strict_tools,
            media=MediaConnector.from_settings(settings),
        )

    @property
    def _store(self) -> ResponseStore:
        if self._store_instance is None:
            self._store_instance = self._open_store()
        return self._store_instance

    @property
    def _sealer(self) -> ReasoningSealer:
        if self._sealer_instance is None:
            self._sealer_instance = self._open_sealer()
        return self._sealer_instance

    # ------------------------------------------------------------ preparing

    async def _earlier(self, previous_id: str | None) -> list[dict[str, Any]]:
        """The conversation a `previous_response_id` continues: its input and its output."""
        if previous_id is None:
            return []
        record = await self._store.get(previous_id)
        if record is None:
            raise InvalidRequestError(
                f"Previous response with id '{previous_id}' not found. Responses created with "
                "store: false are not kept and cannot be continued.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return [*record.input_items, *record.response.get("output", [])]

    def _reasoning_text(self, item: Reasoning, position: int) -> str | None:
        if item.encrypted_content:
            return self._sealer.open(item.encrypted_content, param=f"input[{position}].encrypted_content")
        if item.content:
            return "".join(part.text for part in item.content)
        return None

    async def _prompt(
        self,
        body: CreateResponseRequest | InputTokensRequest,
        requested: int | None,
    ) -> _Prompt:
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        defined = OPENAI_FIELDS if isinstance(body, CreateResponseRequest) else INPUT_TOKENS_FIELDS
        note_ignored_fields(ignored_fields(body, defined, strict=self._limits.reject_unknown_fields))
        for name in ("conversation", "prompt"):
            if (body.model_extra or {}).get(name) is not None:
                raise UnsupportedParameterError(
                    f"'{name}' is not supported by this server"
                    + (
                        "; continue a conversation with previous_response_id"
                        if name == "conversation"
                        else ""
                    ),
                    param=name,
                )
        earlier = await self._earlier(body.previous_response_id)
        new_items = resolve_references(it.parse_input(body.input), earlier, it.parse_input)
        conversation = [*earlier, *(resource(i) for i in new_items)]
        if not conversation:
            raise InvalidRequestError("Missing required parameter: 'input'.", param="input")
        # Earlier turns were checked when they were stored; they are parsed, not re-validated twice.
        items = [*it.parse_input(earlier), *new_items]
        tools = plan_tools(body.tools, body.tool_choice, strict=self._strict_tools)
        for kind in tools.skipped:
            if self._metrics is not None:
                self._metrics.skipped_tools.labels(kind).inc()
            if kind not in _logged_skipped:
                _logged_skipped.add(kind)
                logger.info("left out tools of type %r: this server does not run them (logged once)", kind)
        fmt = response_format(body.text)
        # Counting input tokens (InputTokensRequest) needs no guide.
        structured = body.structured_outputs if isinstance(body, CreateResponseRequest) else None
        if tools.chat_tools and (
            tools.chat_tool_choice == "required" or isinstance(tools.chat_tool_choice, dict)
        ):
            # A forced call is the whole reply, so the text format has nothing to shape this turn
            # (OpenAI takes both together; agents send their output type with every turn).
            fmt = None
        try:
            plan = plan_output(
                tools=tools.chat_tools,
                tool_choice=tools.chat_tool_choice,
                parallel_tool_calls=body.parallel_tool_calls,
                response_format=fmt,
                structured_outputs=structured,
                model_tool_format=runtime.config.tool_parser,
                guided_decoding=runtime.engine.info.guided_decoding,
                template_renders_tools=runtime.tokenizer.renders_tools,
            )
        except GatewayError as exc:
            raise _renamed(exc) from None
        template_kwargs: dict[str, Any] = {}
        if plan.template_tools is not None:
            template_kwargs["tools"] = plan.template_tools
        if body.reasoning is not None:
            template_kwargs.update(effort_template_kwargs(body.reasoning.effort))

        def messages(kept: Sequence[InputItem], refs: list[ImageRef] | None = None) -> list[dict[str, Any]]:
            return template_messages(
                runtime,
                it.to_messages(kept, body.instructions, reasoning_text=self._reasoning_text, images=refs),
            )

        refs: list[ImageRef] = []
        whole = messages(items, refs)
        check_images(runtime, refs, "input_image")
        # Each image once, by its URL: a shorter conversation (truncation) takes its own subset.
        loaded = dict(zip([r.url for r in refs], await self._media.load_images(refs), strict=True))

        def conversation_of(kept: Sequence[InputItem]) -> tuple[list[dict[str, Any]], list[ImageInput]]:
            kept_refs: list[ImageRef] = []
            out = messages(kept, kept_refs)
            return out, [loaded[r.url] for r in kept_refs]

        budget_args: dict[str, Any] = {
            "requested": requested,
            "param": "max_output_tokens",
            "prompt_param": "input",
            "limits": self._limits,
        }
        with tracing.span("tokenize", model=runtime.name):
            rendered = await runtime.tokenizer.render_chat(whole, **template_kwargs)
            text = chat_prompt(runtime, rendered, [loaded[r.url] for r in refs], whole)
            try:
                ids, max_tokens = await prompt_budget(runtime, text, **budget_args)
            except ContextLengthExceededError as exc:
                if body.truncation != "auto":
                    raise _renamed(exc) from None

                # Fitting tries one shorter conversation after another, each mostly pieces the
                # encoder has seen, so on the calling thread.
                def fits(kept: Sequence[InputItem]) -> bool:
                    kept_messages, kept_images = conversation_of(kept)
                    try:
                        prompt_budget_now(
                            runtime,
                            chat_prompt(
                                runtime,
                                runtime.tokenizer.apply_chat_template(kept_messages, **template_kwargs),
                                kept_images,
                                kept_messages,
                            ),
                            **budget_args,
                        )
                    except ContextLengthExceededError:
                        return False
                    return True

                kept = it.truncate(items, fits)
                conversation = conversation[len(conversation) - len(kept) :]
                kept_messages, kept_images = conversation_of(kept)
                rendered = await runtime.tokenizer.render_chat(kept_messages, **template_kwargs)
                text = chat_prompt(runtime, rendered, kept_images, kept_messages)
                ids, max_tokens = await prompt_budget(runtime, text, **budget_args)
            except GatewayError as exc:
                raise _renamed(exc) from None
        return _Prompt(runtime, text, ids, max_tokens, plan, tools, conversation)

    async def prepare(
        self,
        body: CreateResponseRequest,
        *,
        timeout_s: float | None = None,
        priority: int = 0,
        session: str | None = None,
    ) -> PreparedResponse:
        requested = body.max_output_tokens
        prompt = await self._prompt(body, requested)
        runtime = prompt.runtime
        include = set(body.include or ())
        logprobs, _ = (
            token_options(
                runtime,
                logprobs=LOGPROBS_INCLUDE in include,
                top_logprobs=body.top_logprobs,
                top_param="top_logprobs",
                logit_bias=None,
            )
            if LOGPROBS_INCLUDE in include
            else (None, ())
        )
        seed = body.seed
        if seed is None and (body.temperature is None or body.temperature > 0):
            import random

            seed = random.getrandbits(63)
        if seed is not None and not 0 <= seed < 2**64:
            raise InvalidRequestError("seed must be between 0 and 2**64 - 1", param="seed")
        params = SamplingParams(
            max_tokens=prompt.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=seed,
            ignore_eos=bool(body.ignore_eos),
        )
        response_id = new_item_id("resp")
        generation = build_generation(
            runtime,
            request_id=response_id,
            prompt=prompt.prompt,
            prompt_ids=prompt.ids,
            params=params,
            num_sequences=1,
            stops=stop_strings(body.stop, self._limits),
            first_index=0,
            guide=prompt.plan.guide,
            logprobs=logprobs,
            # Codex sends its conversation's prompt_cache_key: prefix routing keeps it on one replica.
            affinity=affinity_key(
                prompt_cache_key=body.prompt_cache_key,
                session=session,
                safety_identifier=body.safety_identifier,
                user=body.user,
            ),
            reasoning=True,
            tool_format=prompt.plan.tool_format,
            priority=priority,
        )
        prepared = PreparedRequest(
            runtime,
            [generation],
            response_id,
            timeout_s=request_deadline(self._limits, timeout_s),
            tool_format=prompt.plan.tool_format,
            tool_names=prompt.plan.tool_names,
            tool_parameters=prompt.plan.tool_parameters,
            forced=prompt.plan.forced,
            forced_name=prompt.plan.forced_name,
            logprobs=logprobs,
        )
        await reserve_quota(prepared)
        start = _start(body, response_id, prepared.created, runtime.name)
        return PreparedResponse(
            body,
            prepared,
            prompt.tools,
            start,
            prompt.conversation,
            seal=ENCRYPTED_INCLUDE in include,
        )

    async def input_tokens(self, body: InputTokensRequest) -> InputTokens:
        # Counted as generation would count it: a budget of one token checks every limit.
        prompt = await self._prompt(body, None)
        ids = prompt.ids
        if ids is None:
            # Counted as the engine sees it.
            text, add_special_tokens = engine_prompt(prompt.runtime, prompt.prompt)
            ids = await prompt.runtime.tokenizer.encode_async(text, add_special_tokens=add_special_tokens)
        return InputTokens(input_tokens=len(ids))

    # ------------------------------------------------------------ generating

    async def _generate(
        self, prepared: PreparedResponse, builder: ResponseBuilder, *, streaming: bool
    ) -> AsyncGenerator[bytes, None]:
        """The response's frames (empty when not streaming: the builder keeps the response). One
        generator, not nested ones: it runs once per token."""
        run = prepared.prepared
        tokenizer = run.runtime.tokenizer
        # The model's reasoning parser, then its tool-call parser (None: the reply is all text).
        parser = run.reply_parsers().get(0)
        names = prepared.tools.names
        reason = "stop"
        # Log probabilities of tokens whose text the parser still holds back.
        held: tuple[TokenLogprob, ...] = ()
        if streaming:
            yield builder.start()
        try:
            async for event in events(run, self._metrics):
                if parser is None:
                    if event.text or event.logprobs:
                        entries = _logprobs(tokenizer, event.logprobs) if run.logprobs is not None else None
                        yield builder.text(event.text, entries)
                else:
                    pieces = parser.feed(event.text, event.token_ids)
                    if event.finish_reason is not None:
                        pieces += parser.finish()
                    # An event's log probabilities go with its answer text; a thinking token's
                    # have no place in an output_text part.
                    tokens = (*held, *event.logprobs) if run.logprobs is not None else ()
                    held = () if pieces else tokens
                    for piece in pieces:
                        if isinstance(piece, ContentDelta):
                            if piece.text:
                                yield builder.text(
                                    piece.text, _logprobs(tokenizer, tokens) if tokens else None
                                )
                                tokens = ()
                        elif isinstance(piece, ReasoningDelta):
                            if piece.text:
                                yield builder.reasoning(piece.text)
                        elif isinstance(piece, ToolCallStart):
                            namespace, name = names.get(piece.name, (None, piece.name))
                            yield builder.function_call(piece.id, name, namespace)
                        else:
                            yield builder.arguments(piece.arguments)
                if event.finish_reason is not None:
                    reason = event.finish_reason
            prompt, completion = run.prompt_tokens, run.completion_tokens
            # OpenAI's ResponseUsage requires both details: a model whose contract does not report
            # KV cache reuse (no perf metrics, or no known block size) says 0, as OpenAI says for a
            # prompt it served without its cache. The engine's reuse is no write in OpenAI's sense
            # (an explicit cache write billed apart), so cache_write_tokens is always 0.
            cached = run.cached_tokens
            usage = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": parser.reasoning_tokens if parser else 0},
                "total_tokens": prompt + completion,
            }
            incomplete = (
                "max_output_tokens" if reason == "length" and not _ends_as_completed(prepared) else None
            )
            finished = builder.finish(usage, incomplete=incomplete)
            if prepared.body.store is not False:
                # Kept before the client hears it is done: a continuation may follow at once.
                response = builder.response
                await self._store.put(
                    StoredResponse(response["id"], time.time(), response, prepared.conversation)
                )
            yield finished
        except Exception as exc:
            if not streaming:
                raise
            error = to_gateway_error(exc)
            logger.log(logging.ERROR if error.status_code >= 500 else logging.INFO, "stream failed: %s", exc)
            code = "rate_limit_exceeded" if error.status_code == 429 else "server_error"
            yield builder.fail(code, error.message)

    def _builder(self, prepared: PreparedResponse, *, streaming: bool) -> ResponseBuilder:
        seal = None
        if prepared.seal:
            model = prepared.prepared.runtime.name

            def seal(text: str) -> str:
                return self._sealer.seal(text, model=model)

        return ResponseBuilder(dict(prepared.start), streaming=streaming, seal=seal)

    async def create(self, prepared: PreparedResponse) -> dict[str, Any]:
        builder = self._builder(prepared, streaming=False)
        async for _ in self._generate(prepared, builder, streaming=False):
            pass
        return builder.response

    def stream(self, prepared: PreparedResponse) -> AsyncGenerator[bytes, None]:
        return self._generate(prepared, self._builder(prepared, streaming=True), streaming=True)

    # ------------------------------------------------------------ stored responses

    async def _record(self, response_id: str) -> StoredResponse:
        record = await self._store.get(response_id)
        if record is None:
            raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
        return record

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        return (await self._record(response_id)).response

    async def delete(self, response_id: str) -> ResponseDeleted:
        if not await self._store.delete(response_id):
            raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
        return ResponseDeleted(id=response_id)

    async def input_items(
        self, response_id: str, *, limit: int, order: str, after: str | None
    ) -> ResponseItemList:
        if not 1 <= limit <= 100:
            raise InvalidRequestError("limit must be between 1 and 100", param="limit")
        if order not in ("asc", "desc"):
            raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
        record = await self._record(response_id)
        data, more = page(record.input_items, limit=limit, order=order, after=after)
        return ResponseItemList(
            data=data,
            has_more=more,
            first_id=data[0]["id"] if data else None,
            last_id=data[-1]["id"] if data else None,
        )

    async def close(self) -> None:
        if self._store_instance is not None:
            await self._store_instance.close()


def _start(body: CreateResponseRequest, response_id: str, created: int, model: str) -> dict[str, Any]:
    text: dict[str, Any] = {"format": {"type": "text"}}
    if body.text is not None:
        text = body.text.model_dump(mode="json", by_alias=True, exclude_none=True)
        text.setdefault("format", {"type": "text"})
    start = Response(
        id=response_id,
        created_at=created,
        status="in_progress",
        model=model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        reasoning=body.reasoning.model_dump(mode="json", exclude_none=True) if body.reasoning else None,
        store=body.store is not False,
        temperature=body.temperature,
        text=text,
        tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
        tools=[_echo_tool(t) for t in body.tools or ()],
        top_logprobs=body.top_logprobs,
        top_p=body.top_p,
        truncation=body.truncation or "disabled",
        user=body.user,
        metadata=body.metadata or {},
        prompt_cache_key=body.prompt_cache_key,
        safety_identifier=body.safety_identifier,
    )
    return start.model_dump(mode="json")


def _echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        return tool
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
    }


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, starts_text: bool) -> dict[str, Any]:
    text, raw = token_string(tokenizer, token_id, starts_text=starts_text)
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def _logprobs(tokenizer: Tokenizer, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI's LogProb objects (token, logprob, bytes, top_logprobs) of an output_text part."""
    return [
        {
            **_entry(tokenizer, e.token_id, e.logprob, e.starts_text),
            "top_logprobs": [_entry(tokenizer, t, lp, e.starts_text) for t, lp in e.top],
        }
        for e in entries
    ]


def _ends_as_completed(prepared: PreparedResponse) -> bool:
    """Whether a reply cut at its token limit is reported completed: only when the limit was the
    model's default (the client set none, and the context left more room) and the model is
    configured so (`default_limit_status`)."""
    config = prepared.prepared.runtime.config
    return (
        config.default_limit_status == "completed"
        and prepared.body.max_output_tokens is None
        and config.default_max_tokens is not None
        and prepared.prepared.generations[0].request.params.max_tokens == config.default_max_tokens
    )
