"""Request validation and budgeting, in one place for every API: limits, stop strings, n, the
prompt's token budget and max tokens, log probabilities, logit_bias, sampling parameters and the
deadline. Everything here fails before anything is sent to the engine. API-neutral: each API passes
its own fields (and the names its clients know them by, for error messages)."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.engine import SamplingParams
from gateway.errors import ContextLengthExceededError, InvalidRequestError, UnsupportedParameterError

if TYPE_CHECKING:
    from gateway.core.models import ModelRuntime
    from gateway.core.prompt import Prompt

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_n: int
    max_stop_strings: int
    max_stop_string_length: int
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None
    request_timeout_s: float | None = None
    # 400 for any body field OpenAI does not define, as OpenAI answers (else: ignored and named).
    reject_unknown_fields: bool = False


def stop_strings(stop: str | list[str] | None, limits: RequestLimits) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > limits.max_stop_strings:
        raise InvalidRequestError(
            f"at most {limits.max_stop_strings} stop strings are allowed, got {len(stops)}", param="stop"
        )
    for s in stops:
        if len(s) > limits.max_stop_string_length:
            raise InvalidRequestError(
                f"stop strings are limited to {limits.max_stop_string_length} characters", param="stop"
            )
    return tuple(s for s in stops if s)


def choose_n(n: int | None, limits: RequestLimits) -> int:
    n = 1 if n is None else n
    if n > limits.max_n:
        raise InvalidRequestError(f"n must be at most {limits.max_n}, got {n}", param="n")
    return n


def resolve_max_tokens(
    requested: int | None,
    prompt_tokens: int,
    max_model_len: int | None,
    *,
    param: str,
    prompt_param: str,
    limits: RequestLimits,
) -> int:
    """The request's token budget. With none given, what is left of the context (capped by the
    server's limit): never a silent 16. `param` names the max-tokens field the client used,
    `prompt_param` the field that holds its prompt (`prompt`, `messages`): errors name them."""
    if limits.max_prompt_tokens is not None and prompt_tokens > limits.max_prompt_tokens:
        raise InvalidRequestError(
            f"the prompt has {prompt_tokens} tokens; this server accepts at most {limits.max_prompt_tokens}",
            param=prompt_param,
        )
    if requested is not None and limits.max_tokens is not None and requested > limits.max_tokens:
        raise InvalidRequestError(f"{param} must be at most {limits.max_tokens}", param=param)
    if max_model_len is None:
        if requested is not None:
            return requested
        if limits.max_tokens is not None:
            return limits.max_tokens
        raise InvalidRequestError(
            "this model's context length is unknown; set max_tokens or configure max_model_len", param=param
        )
    room = max_model_len - prompt_tokens
    if room <= 0 or (requested is not None and requested > room):
        if requested is None:
            # No completion length was asked for (or, Anthropic's, only a cap): the prompt alone.
            raise ContextLengthExceededError(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                f"has {prompt_tokens} tokens, which leaves no room for the completion. "
                "Please reduce the length of the prompt.",
                param=prompt_param,
            )
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, {requested} in the "
            "completion). Please reduce the length of the prompt or completion.",
            param=prompt_param,
        )
    if requested is not None:
        return requested
    return room if limits.max_tokens is None else min(room, limits.max_tokens)


class SamplingFields(Protocol):
    """The sampling fields a generation request carries (OpenAI's, plus TensorRT-LLM's knobs)."""

    @property
    def temperature(self) -> float | None: ...
    @property
    def top_p(self) -> float | None: ...
    @property
    def top_k(self) -> int | None: ...
    @property
    def seed(self) -> int | None: ...
    @property
    def min_tokens(self) -> int | None: ...
    @property
    def presence_penalty(self) -> float | None: ...
    @property
    def frequency_penalty(self) -> float | None: ...
    @property
    def repetition_penalty(self) -> float | None: ...
    @property
    def length_penalty(self) -> float | None: ...
    @property
    def ignore_eos(self) -> bool | None: ...


def sampling_params(request: SamplingFields, max_tokens: int) -> SamplingParams:
    seed = request.seed
    sampling = request.temperature is None or request.temperature > 0
    if seed is None and sampling:
        # TensorRT-LLM's default seed is 0: without a fresh one every request samples the same text.
        seed = random.getrandbits(63)
    if seed is not None and not 0 <= seed < 2**64:
        raise InvalidRequestError("seed must be between 0 and 2**64 - 1", param="seed")
    if request.min_tokens is not None and request.min_tokens > max_tokens:
        raise InvalidRequestError("min_tokens must not exceed max_tokens", param="min_tokens")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=seed,
        min_tokens=request.min_tokens,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        repetition_penalty=request.repetition_penalty,
        length_penalty=request.length_penalty,
        ignore_eos=bool(request.ignore_eos),
    )


def logit_bias_pairs(
    raw: dict[str, float] | None, vocab_size: int, *, supported: bool
) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} checked: ids in the vocabulary, biases within [-100, 100]."""
    if not raw:
        return ()
    if not supported:
        raise UnsupportedParameterError(
            "this model cannot apply logit_bias: it needs a TensorRT-LLM engine model's embedding_bias input "
            "(the C++ repository served with route=engine)",
            param="logit_bias",
        )
    out = []
    for key, value in raw.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequestError(
                f"logit_bias key {key!r} is not a token id", param="logit_bias"
            ) from None
        if not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"logit_bias token {token} is outside the vocabulary", param="logit_bias"
            )
        if not -100 <= value <= 100:
            raise InvalidRequestError("logit_bias values must be between -100 and 100", param="logit_bias")
        out.append((token, float(value)))
    return tuple(out)


def request_deadline(limits: RequestLimits, header_s: float | None) -> float | None:
    """Seconds this request may run: the tighter of the server's and the client's deadline."""
    options = [t for t in (limits.request_timeout_s, header_s) if t is not None and t > 0]
    return min(options) if options else None


def engine_prompt(runtime: ModelRuntime, prompt: Prompt) -> tuple[str, bool]:
    """The prompt text as the engine is sent it, and whether special tokens are added when it is
    counted (gateway.core.prompt decides that for the C++ routes). An engine that tokenizes text
    itself adding special tokens (the llmapi model: the LLM API adds BOS) gets the text without
    the BOS a chat template wrote, or BOS would be doubled; counted with special tokens added,
    that is the template's own count."""
    if not runtime.engine.info.adds_special_tokens:
        return prompt.text, prompt.add_special_tokens
    text = prompt.text
    bos = runtime.tokenizer.bos_token
    if bos and text.startswith(bos):
        text = text[len(bos) :]
    return text, True


def counted_prompt(runtime: ModelRuntime, prompt: Prompt) -> tuple[str, bool]:
    """The text whose ids are the prompt's count, and whether special tokens are added: the
    engine's text, with each image's placeholder expanded as the model's processor expands it
    (`ModelRuntime.expand_images`), so an image counts the tokens the model reads for it."""
    text, add_special_tokens = engine_prompt(runtime, prompt)
    if prompt.images and runtime.expand_images is not None:
        text = runtime.expand_images(text, prompt.images)
    return text, add_special_tokens


@dataclass(frozen=True, slots=True)
class _Budget:
    """What a prompt's budget is worked out with (prompt_budget's arguments)."""

    requested: int | None
    param: str
    prompt_param: str
    limits: RequestLimits
    ceiling: int | None


async def prompt_budget(
    runtime: ModelRuntime,
    prompt: Prompt,
    *,
    requested: int | None,
    param: str,
    prompt_param: str,
    limits: RequestLimits,
    ceiling: int | None = None,
    need_ids: bool = False,
) -> tuple[Sequence[int] | None, int]:
    """The prompt's token ids and the request's max_tokens, checked against every limit.

    `ceiling` is a limit the client set that caps what is left of the context instead of having
    to fit in it (Anthropic's `max_tokens`); with one, the model's default output limit does not
    apply, since the client did set a limit.

    Encoding a prompt is a good part of the gateway's time before the engine request goes out.
    When the engine does not need the ids and an upper bound on their count already proves every
    limit holds and fixes max_tokens, the ids are None: the request goes out first and the prompt
    is counted for usage afterwards (Generation.prompt_tokens). Otherwise the exact count decides,
    errors included. A long prompt is encoded off the event loop (Tokenizer.encode_async).
    `need_ids`: the caller needs the ids whatever the engine does (to score the prompt)."""
    how = _Budget(_requested(runtime, requested), param, prompt_param, limits, ceiling)
    text, add_special_tokens = counted_prompt(runtime, prompt)
    bounded = None if need_ids else _bounded_budget(runtime, text, add_special_tokens, how)
    if bounded is not None:
        return None, bounded
    ids = await runtime.tokenizer.encode_async(text, add_special_tokens=add_special_tokens)
    return ids, _exact_budget(runtime, len(ids), how)


def prompt_budget_now(
    runtime: ModelRuntime,
    prompt: Prompt,
    *,
    requested: int | None,
    param: str,
    prompt_param: str,
    limits: RequestLimits,
    ceiling: int | None = None,
) -> tuple[Sequence[int] | None, int]:
    """`prompt_budget` on the calling thread, for callers that try many prompts in a row (fitting
    a conversation by dropping items): each is mostly pieces already encoded."""
    how = _Budget(_requested(runtime, requested), param, prompt_param, limits, ceiling)
    text, add_special_tokens = counted_prompt(runtime, prompt)
    bounded = _bounded_budget(runtime, text, add_special_tokens, how)
    if bounded is not None:
        return None, bounded
    ids = runtime.tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return ids, _exact_budget(runtime, len(ids), how)


def _requested(runtime: ModelRuntime, requested: int | None) -> int | None:
    if requested is None and runtime.max_model_len is None:
        # No context length to take the rest of: the model's default output limit, if it has one.
        return runtime.config.default_max_tokens
    return requested


def _bounded_budget(runtime: ModelRuntime, text: str, add_special_tokens: bool, how: _Budget) -> int | None:
    """max_tokens where a bound on the prompt's length proves every limit without its ids.
    (The stock preprocessing adds special tokens, chat templates write BOS themselves, and the
    count must match what the engine sees: `add_special_tokens` says which.)"""
    if runtime.engine.info.needs_prompt_ids or (how.requested is None and runtime.max_model_len is not None):
        return None
    bound = runtime.tokenizer.token_bound(text, add_special_tokens=add_special_tokens)
    if bound is None:
        return None
    try:
        budget = resolve_max_tokens(
            how.requested,
            bound,
            runtime.max_model_len,
            param=how.param,
            prompt_param=how.prompt_param,
            limits=how.limits,
        )
    except InvalidRequestError:
        return None  # Near a limit, or over it: the exact count decides, and names it.
    return _default_limit(runtime, how.requested, budget, how.ceiling)


def _exact_budget(runtime: ModelRuntime, count: int, how: _Budget) -> int:
    budget = resolve_max_tokens(
        how.requested,
        count,
        runtime.max_model_len,
        param=how.param,
        prompt_param=how.prompt_param,
        limits=how.limits,
    )
    return _default_limit(runtime, how.requested, budget, how.ceiling)


def _default_limit(runtime: ModelRuntime, requested: int | None, budget: int, ceiling: int | None) -> int:
    if ceiling is not None:
        return min(budget, ceiling)
    # The model's own default output limit, for clients that set none: what is left of a long
    # context would let a model that never ends by itself run for minutes.
    default = runtime.config.default_max_tokens
    if requested is None and default is not None:
        return min(budget, default)
    return budget


def logprobs_requested(
    *, enabled: bool, top: int | None, top_param: str, supported: bool, top_supported: bool
) -> int | None:
    """How many alternatives per token the request asks for (None: no log probabilities)."""
    if not enabled:
        if top:
            raise InvalidRequestError(f"{top_param} requires logprobs to be true", param=top_param)
        return None
    if not supported:
        raise UnsupportedParameterError(
            "this model does not return log probabilities (it needs output_ids and return_log_probs)",
            param="logprobs",
        )
    if top and not top_supported:
        raise UnsupportedParameterError(
            "this model cannot return top alternatives (it needs return_generation_logits)", param=top_param
        )
    return top or 0


def prompt_scoring(runtime: ModelRuntime, top: int | None, *, param: str) -> int | None:
    """How many alternatives per prompt token the request asks for (None: the prompt is not
    scored), checked against the engine: a model that cannot score its prompt is a 400 naming
    the field that asked, never an answer without the prompt's log probabilities."""
    if top is None:
        return None
    if not runtime.engine.info.prompt_logprobs:
        raise UnsupportedParameterError(
            f"`{param}` needs the prompt's log probabilities, which model {runtime.name!r} cannot "
            "return: its engine returns no context logits (a TensorRT-LLM engine built with "
            "--gather_context_logits, served on the engine route, with the `gather_context_logits` "
            "model parameter set)",
            param=param,
        )
    return top


def token_options(
    runtime: ModelRuntime,
    *,
    logprobs: bool,
    top_logprobs: int | None,
    top_param: str,
    logit_bias: dict[str, float] | None,
) -> tuple[int | None, tuple[tuple[int, float], ...]]:
    """The per-token options the APIs offer, checked against what the engine can do:
    (alternatives per token or None, logit bias pairs)."""
    info = runtime.engine.info
    alternatives = logprobs_requested(
        enabled=logprobs,
        top=top_logprobs,
        top_param=top_param,
        supported=info.logprobs,
        top_supported=info.top_logprobs,
    )
    return alternatives, logit_bias_pairs(logit_bias, runtime.vocab_size, supported=info.logit_bias)


def client_chose_deadline(limits: RequestLimits, header_s: float | None) -> bool:
    """Whether the client's own deadline (X-Request-Timeout) is the one that applies."""
    server = limits.request_timeout_s
    return header_s is not None and header_s > 0 and (server is None or header_s <= server)
