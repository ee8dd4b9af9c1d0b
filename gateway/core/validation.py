"""Pure translation of OpenAI request fields into engine sampling parameters, with the checks
that must fail before anything is sent to Triton."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from gateway.engine import SamplingParams
from gateway.errors import ContextLengthExceededError, InvalidRequestError, UnsupportedParameterError
from gateway.protocol.openai import ChatCompletionRequest, CompletionRequest

logger = logging.getLogger(__name__)

# Unknown body fields are accepted like OpenAI does; each name is logged once per process.
_logged_unknown_fields: set[str] = set()


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_n: int
    max_stop_strings: int
    max_stop_string_length: int
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None
    request_timeout_s: float | None = None


def log_unknown_fields(extra: dict[str, Any] | None) -> None:
    for name in extra or ():
        if name not in _logged_unknown_fields:
            _logged_unknown_fields.add(name)
            logger.info("ignoring unknown request field %r (logged once)", name)


def reject_unsupported(request: CompletionRequest | ChatCompletionRequest) -> None:
    """Fields that would change the result but are not served yet: a 400 naming them, never a
    silent default. (Chat serves every field it accepts.)"""
    if not isinstance(request, CompletionRequest):
        return
    checks = [
        ("best_of", request.best_of is not None and request.best_of != (request.n or 1)),
        ("suffix", bool(request.suffix)),
    ]
    for name, present in checks:
        if present:
            raise UnsupportedParameterError(f"`{name}` is not supported by this server yet", param=name)


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
    limits: RequestLimits,
) -> int:
    """The request's token budget. With none given, what is left of the context (capped by the
    server's limit): never a silent 16."""
    prompt_param = "messages" if param == "max_completion_tokens" else "prompt"
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
        asked = requested if requested is not None else 1
        raise ContextLengthExceededError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the prompt, {asked} in the completion). "
            "Please reduce the length of the prompt or completion.",
            param=prompt_param,
        )
    if requested is not None:
        return requested
    return room if limits.max_tokens is None else min(room, limits.max_tokens)


def sampling_params(
    request: CompletionRequest | ChatCompletionRequest, max_tokens: int, n: int
) -> SamplingParams:
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


def logit_bias(
    raw: dict[str, float] | None, vocab_size: int, *, supported: bool
) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} checked: ids in the vocabulary, biases within [-100, 100]."""
    if not raw:
        return ()
    if not supported:
        raise UnsupportedParameterError(
            "logit_bias needs the engine's embedding_bias input: serve this model with route=engine",
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
