"""What every API's service shares: turning a validated prompt into engine requests and choice
states, and running them (deadline, metrics, tracing, cancellation)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway import tracing
from gateway.asyncutil import until_deadline
from gateway.config import Settings
from gateway.core.choices import (
    ChoiceEvent,
    ChoiceState,
    GenerationTotals,
    make_choices,
    merge,
    run_generation,
)
from gateway.core.models import ModelRegistry, ModelRuntime
from gateway.core.prompt import Prompt
from gateway.core.validation import RequestLimits, counted_prompt, engine_prompt
from gateway.engine import EngineInfo, GenerationRequest, SamplingParams
from gateway.errors import (
    ClientDeadlineExceededError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    GatewayError,
    InvalidRequestError,
    ServerConfigError,
    UnsupportedParameterError,
    to_gateway_error,
)
from gateway.media import MediaConnector, MediaOptions
from gateway.metrics import GatewayMetrics, RequestTimer
from gateway.ratelimit import current_quota
from gateway.text.ids import TokenIds
from gateway.text.reasoning import ReasoningFormat
from gateway.text.reply import ReplyParser, reasoning_format_of
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls import ForcedToolParser, StreamingToolParser
from gateway.text.tool_calls.registry import call_id_maker, needs_special_tokens

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Generation:
    """One prompt's engine request and the choices it produces."""

    request: GenerationRequest
    choices: list[ChoiceState]
    totals: GenerationTotals
    # A prompt sent before it was tokenized (see prompt_budget): its text and whether special
    # tokens are added (the model's setting), counted when first asked for, at the end.
    uncounted: tuple[Tokenizer, str, bool] | None = None
    # The model's reasoning format, when the reply is to be parsed for thinking (see build_generation).
    reasoning: ReasoningFormat | None = None

    async def count_prompt(self) -> None:
        """Count a prompt sent before it was tokenized, off the event loop where it is long."""
        if self.totals.prompt_tokens is None and self.uncounted is not None:
            tokenizer, text, add_special = self.uncounted
            ids = await tokenizer.encode_async(text, add_special_tokens=add_special)
            if self.totals.prompt_tokens is None:  # (the engine may have said meanwhile)
                self.totals.prompt_tokens = len(ids)

    @property
    def prompt_tokens(self) -> int:
        if self.totals.prompt_tokens is None:
            assert self.uncounted is not None, "a prompt is counted up front or later, never neither"
            tokenizer, text, add_special = self.uncounted
            self.totals.prompt_tokens = len(tokenizer.encode(text, add_special_tokens=add_special))
        return self.totals.prompt_tokens


@dataclass(slots=True)
class PreparedRequest:
    runtime: ModelRuntime
    generations: list[Generation]
    response_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    include_usage: bool = False
    # Seconds the generation may take (None: no deadline), and whether the client chose it.
    timeout_s: float | None = None
    client_deadline: bool = False
    # Chat only: how to find tool calls in the reply ("none": plain content).
    tool_format: str = "none"
    tool_names: frozenset[str] = frozenset()
    # Each declared tool's parameters schema (see OutputPlan).
    tool_parameters: Mapping[str, Any] = field(default_factory=dict)
    # Guided decoding forces the reply to be a call (of `forced_name`, when known in advance).
    forced: bool = False
    forced_name: str | None = None
    # None: no log probabilities; k: with k alternatives per token.
    logprobs: int | None = None
    # None: the prompt is not scored; k: each prompt token's log probability, k alternatives.
    prompt_logprobs: int | None = None

    @property
    def choices(self) -> list[ChoiceState]:
        return [c for g in self.generations for c in g.choices]

    def reply_parsers(self, make_id: Callable[[], str] | None = None) -> dict[int, ReplyParser]:
        """A parser per choice index that splits the reply into thinking, answer and tool calls;
        empty when the reply is plain content (no reasoning format, no tool format). Calls are
        named by `make_id`, or as the tool format names them (`call_id_maker`)."""
        if make_id is None:
            make_id = call_id_maker(self.tool_format)
        parsers: dict[int, ReplyParser] = {}
        tokenizer = self.runtime.tokenizer
        for generation in self.generations:
            fmt = generation.reasoning
            if fmt is None and self.tool_format == "none":
                continue
            count_text = None
            if fmt is not None and not self.runtime.engine.info.exposes_token_ids:

                def count_text(text: str) -> int:
                    return len(tokenizer.encode(text, add_special_tokens=False))

            for choice in generation.choices:
                reasoning = None
                # A reply forced to be a call is the guide's JSON from its first token: there is
                # no thinking in it, even where the prompt opened a think block.
                if fmt is not None and not self.forced:
                    # The chat template may have opened (or closed) the think block in the prompt.
                    reasoning = fmt.parser(
                        prompt=generation.request.prompt_text,
                        marker_ids=fmt.marker_ids(tokenizer.vocab),
                        make_id=make_id,
                        encoding=self.runtime.reply_encoding,
                    )
                tools: StreamingToolParser | ForcedToolParser | None = None
                if self.forced:
                    tools = ForcedToolParser(
                        name=self.forced_name, tool_names=self.tool_names, make_id=make_id
                    )
                elif self.tool_format != "none":
                    tools = StreamingToolParser(
                        self.tool_format,
                        tool_names=self.tool_names,
                        tool_parameters=self.tool_parameters,
                        make_id=make_id,
                    )
                parsers[choice.index] = ReplyParser(
                    reasoning=reasoning,
                    tools=tools,
                    count_text=count_text,
                    completion_tokens=_completion_tokens_of(choice) if count_text is not None else None,
                )
        return parsers

    async def count_prompts(self) -> None:
        """Make `prompt_tokens` known without encoding on the event loop."""
        for generation in self.generations:
            await generation.count_prompt()

    @property
    def prompt_tokens(self) -> int:
        return sum(g.prompt_tokens for g in self.generations)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens served from the engine's KV cache; None unless every prompt's engine
        request reported it (so a usage never shows a count that is really unknown)."""
        counts = [g.totals.cached_tokens for g in self.generations]
        if not counts or any(n is None for n in counts):
            return None
        return sum(n for n in counts if n is not None)


S = TypeVar("S", bound="GenerationService")


class GenerationService:
    """What the APIs' services share: where models, limits and metrics come from."""

    def __init__(
        self,
        registry: ModelRegistry,
        limits: RequestLimits,
        metrics: GatewayMetrics | None,
        *,
        media: MediaConnector | None = None,
    ) -> None:
        self._registry = registry
        self._limits = limits
        self._metrics = metrics
        # Where the APIs' image parts are loaded (fetched, decoded, checked): the only way in.
        self._media = media if media is not None else MediaConnector(MediaOptions())

    @classmethod
    def build(
        cls: type[S],
        registry: ModelRegistry,
        limits: RequestLimits,
        metrics: GatewayMetrics | None,
        settings: Settings,
    ) -> S:
        """The service as the app makes it at start-up; a service with settings of its own (a
        store, a key) reads them here."""
        return cls(registry, limits, metrics, media=MediaConnector.from_settings(settings))

    async def close(self) -> None:
        """At shutdown: release what the service opened (nothing, unless it has state)."""


def stream_failure(exc: Exception) -> GatewayError:
    """What a stream that failed after it started reports (each API writes it as its own error
    event), logged by severity."""
    error = to_gateway_error(exc)
    # A deadline the client chose is its own choice: no server error.
    serious = error.status_code >= 500 and not isinstance(error, ClientDeadlineExceededError)
    logger.log(logging.ERROR if serious else logging.INFO, "stream failed: %s", exc)
    return error


def affinity_key(
    *,
    prompt_cache_key: str | None,
    session: str | None,
    safety_identifier: str | None,
    user: str | None,
) -> str | None:
    """What keeps a conversation on one engine replica (whose KV cache holds it): the client's
    cache key first, then its session, then the end user; namespaced so that the kinds never meet."""
    for kind, value in (
        ("cache", prompt_cache_key),
        ("session", session),
        ("user", safety_identifier),
        ("user", user),
    ):
        if value:
            return f"{kind}:{value}"
    return None


async def reserve_quota(prepared: PreparedRequest) -> None:
    """Take the request's tokens from its key's rate limit (when it has one): each prompt plus its
    output limit for every sequence, a prompt not yet tokenized estimated at 4 characters a token
    (the request settles to its real usage when it ends). A RateLimitError (429) when over it."""
    quota = current_quota.get()
    if quota is None:
        return
    tokens = 0
    for g in prepared.generations:
        prompt = g.totals.prompt_tokens
        if prompt is None:
            prompt = -(-len(g.request.prompt_text) // 4)
        tokens += prompt + g.request.params.max_tokens * g.request.num_sequences
    await quota.reserve(tokens)


def reasoning_format(runtime: ModelRuntime) -> ReasoningFormat | None:
    """The model's reasoning format (None: it has none). A format whose markers are special
    tokens (gpt_oss) is parsed from text decoded with special tokens kept, which only the gateway's
    own decoding of the generated ids can give: a route that returns text (an ensemble without
    `output_ids`) has already dropped them, so such a model cannot be served there."""
    fmt = reasoning_format_of(runtime.config.reasoning_parser, runtime.config.tool_parser)
    if fmt is not None and fmt.keeps_special_tokens and not runtime.engine.info.exposes_token_ids:
        raise ServerConfigError(
            f"model {runtime.name!r}: reasoning_parser {fmt.name} needs the generated token ids (its "
            f"markers are special tokens), but its route ({runtime.engine.info.route or 'ensemble'}) "
            "returns text; serve it by the engine route (route=engine) or an ensemble that returns "
            "output_ids",
            code="reasoning_parser_needs_token_ids",
        )
    return fmt


def _completion_tokens_of(choice: ChoiceState) -> Callable[[], int]:
    """The choice's completion token count, read when its reply's usage is written."""
    return lambda: choice.completion_tokens


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _frozen_ids(ids: Sequence[int]) -> Sequence[int]:
    """The request's own copy of the prompt's ids: TokenIds are read-only already (and one array,
    which the engine route sends as is); anything else becomes a tuple."""
    return ids if isinstance(ids, TokenIds) else tuple(ids)


def build_generation(
    runtime: ModelRuntime,
    *,
    request_id: str,
    prompt: Prompt,
    prompt_ids: Sequence[int] | None,
    params: SamplingParams,
    num_sequences: int,
    stops: Sequence[str],
    first_index: int,
    guide: tuple[str, str] | None = None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    logit_bias: tuple[tuple[int, float], ...] = (),
    affinity: str | None = None,
    stream: bool = True,
    reasoning: bool = False,
    tool_format: str = "none",
    priority: int = 0,
) -> Generation:
    """`reasoning`: the reply will be split by the model's reasoning format (chat completions,
    Responses, Messages), so it is decoded the way that format reads it, with its ids kept for
    counting the thinking's tokens. `tool_format`: the reply will be parsed for calls in that
    format, whose markers may be special tokens that the decode must then keep."""
    fmt = reasoning_format(runtime) if reasoning else None
    keep_special = (fmt is not None and fmt.keeps_special_tokens) or needs_special_tokens(
        tool_format, runtime.tokenizer.skipped_tokens
    )
    # Ids left for later (prompt_budget) come from non-empty text, and so are not empty either.
    if prompt_ids is not None and not prompt_ids:
        raise InvalidRequestError("the prompt must not be empty", param="prompt")
    engine = runtime.engine.info
    _check_sampling(engine.sampling, params)
    if prompt.images and not engine.images:
        raise UnsupportedParameterError("this model does not take images", param="messages")
    if prompt.images:
        check_image_request(engine, prompt)
    prompt_text, _ = engine_prompt(runtime, prompt)
    info = runtime.tokenizer.info
    request = GenerationRequest(
        request_id=request_id,
        prompt_text=prompt_text,
        prompt_ids=() if prompt_ids is None else _frozen_ids(prompt_ids),
        params=params,
        num_sequences=num_sequences,
        end_id=info.eos_token_id,
        pad_id=info.pad_token_id,
        end_token_ids=info.extra_end_ids,
        end_token_strings=info.extra_end_tokens,
        guide=guide,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=logit_bias,
        vocab_size=runtime.vocab_size,
        affinity=affinity,
        stream=stream,
        priority=priority,
        images=prompt.images,
        question=prompt.question,
    )
    # A text result that repeats the prompt starts with the prompt's decoding: cut it there.
    repeated = not engine.exposes_token_ids and engine.repeats_prompt[0 if stream else 1]
    choices = make_choices(
        runtime.tokenizer,
        request,
        token_ids=engine.exposes_token_ids,
        first_index=first_index,
        stops=stops,
        text_prefix=runtime.tokenizer.decode(prompt_ids) if repeated and prompt_ids else "",
        skip_special_tokens=not keep_special,
        keep_ids=fmt is not None and engine.exposes_token_ids,
        count_text=_text_counter(runtime.tokenizer) if engine.counts_text else None,
    )
    if prompt_ids is None:
        counted_text, add_special_tokens = counted_prompt(runtime, prompt)
        uncounted = (runtime.tokenizer, counted_text, add_special_tokens)
        return Generation(request, choices, GenerationTotals(prompt_tokens=None), uncounted, fmt)
    return Generation(request, choices, GenerationTotals(prompt_tokens=len(prompt_ids)), None, fmt)


# A sampling parameter as SamplingParams holds it, and whether a request set it.
_SET: dict[str, Callable[[SamplingParams], bool]] = {
    "temperature": lambda p: p.temperature is not None,
    "top_p": lambda p: p.top_p is not None,
    "top_k": lambda p: p.top_k is not None,
    "seed": lambda p: False,  # drawn by the gateway when not given; every engine takes it or none
    "min_tokens": lambda p: bool(p.min_tokens),
    "presence_penalty": lambda p: p.presence_penalty is not None,
    "frequency_penalty": lambda p: p.frequency_penalty is not None,
    "repetition_penalty": lambda p: p.repetition_penalty is not None,
    "length_penalty": lambda p: p.length_penalty is not None,
    "ignore_eos": lambda p: p.ignore_eos,
}


def _check_sampling(supported: frozenset[str] | None, params: SamplingParams) -> None:
    """A 400 naming a sampling parameter the engine has no input for, never a silent drop."""
    if supported is None:
        return
    for name, is_set in _SET.items():
        if name not in supported and is_set(params):
            raise UnsupportedParameterError(f"this model does not take {name}", param=name)


def _text_counter(tokenizer: Tokenizer) -> Callable[[str], int]:
    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


async def events(prepared: PreparedRequest, metrics: GatewayMetrics | None) -> AsyncIterator[ChoiceEvent]:
    """All choice events of a prepared request, timed for the metrics."""
    timer = RequestTimer(metrics, prepared.runtime.name)
    span = tracing.start_span("generate", model=prepared.runtime.name, choices=len(prepared.choices))
    engine = prepared.runtime.engine
    streams = [run_generation(engine, g.request, g.choices, g.totals) for g in prepared.generations]
    deadline = None
    if prepared.timeout_s is not None:
        deadline = asyncio.get_running_loop().time() + prepared.timeout_s
    merged = merge(streams)
    try:
        async for event in until_deadline(merged, deadline):
            if event.text:
                timer.text()
            yield event
    except TimeoutError:
        _count(metrics, cancelled="deadline", error="timeout")
        if prepared.client_deadline:
            raise ClientDeadlineExceededError(
                f"The request did not finish within the deadline of {prepared.timeout_s:g} s "
                "it asked for (X-Request-Timeout)."
            ) from None
        raise DeadlineExceededError(
            f"The request did not finish within its deadline of {prepared.timeout_s:g} s."
        ) from None
    except (EngineError, EngineUnavailableError) as exc:
        _count(metrics, error=exc.code)
        raise
    except (asyncio.CancelledError, GeneratorExit):
        # The client went away (or stopped reading): closing the streams cancels Triton.
        _count(metrics, cancelled="client_disconnect")
        raise
    finally:
        await merged.aclose()  # type: ignore[attr-defined]
        timer.close()
        span.end()
    if any(g.totals.stopped_early for g in prepared.generations):
        _count(metrics, cancelled="finished_early")
    await prepared.count_prompts()
    timer.done(prepared.prompt_tokens, prepared.completion_tokens)


def _count(metrics: GatewayMetrics | None, *, cancelled: str | None = None, error: str | None = None) -> None:
    if metrics is None:
        return
    if cancelled is not None:
        metrics.cancellations.labels(cancelled).inc()
    if error is not None:
        metrics.triton_errors.labels(error).inc()


def check_image_request(engine: EngineInfo, prompt: Prompt) -> None:
    """Refuse, before anything is sent, images the engine's contract cannot carry as the client
    sent them (never a dropped image or turn)."""
    limit = engine.images_per_request
    if limit is not None and len(prompt.images) > limit:
        raise InvalidRequestError(
            f"this model takes {limit} image{'s' if limit > 1 else ''} per request; the request has "
            f"{len(prompt.images)}",
            param="messages",
        )
    if engine.images_as_question and prompt.question is None:
        raise InvalidRequestError(IMAGES_AS_QUESTION, param="messages")


IMAGES_AS_QUESTION = (
    "this model renders its chat template itself around one question and its images, so an image "
    "request must be a single user message whose images come before its text (no system prompt, "
    "earlier turns, tools or text before an image)"
)
