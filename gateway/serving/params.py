"""Pure translation of OpenAI request fields into engine sampling parameters, with the checks
that must fail before anything is sent to Triton."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.engine import SamplingParams
from gateway.errors import ContextLengthExceededError, InvalidRequestError, UnsupportedParameterError
from gateway.protocol.openai import (
    KNOWN_EXTENSION_FIELDS,
    OPENAI_CHAT_FIELDS,
    OPENAI_COMPLETION_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)

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


def ignored_fields(request: CompletionRequest | ChatCompletionRequest, *, strict: bool) -> tuple[str, ...]:
    """The body's top-level fields the gateway does not use, told to the client (a response
    header) rather than silently dropped. A near-miss of a field it knows (`max_token`,
    `temprature`) is a 400 naming that field, for a typo would otherwise quietly change the
    result; with `strict`, so is any field OpenAI does not define, with OpenAI's own message."""
    extra = request.model_extra
    if not extra:
        return ()
    chat = isinstance(request, ChatCompletionRequest)
    defined = OPENAI_CHAT_FIELDS if chat else OPENAI_COMPLETION_FIELDS
    known = defined | type(request).model_fields.keys()
    unrecognized = []
    for name in extra:
        if name in defined:
            continue
        near = None if name in KNOWN_EXTENSION_FIELDS else resembles(name, known)
        if near is not None:
            raise InvalidRequestError(
                f"Unrecognized request argument supplied: {name} (did you mean `{near}`?)",
                param=name,
                code="unknown_parameter",
            )
        unrecognized.append(name)
    if strict and unrecognized:
        plural = "s" if len(unrecognized) > 1 else ""
        raise InvalidRequestError(
            f"Unrecognized request argument{plural} supplied: {', '.join(unrecognized)}",
            param=unrecognized[0],
            code="unknown_parameter",
        )
    return tuple(extra)


def check_stream_options(request: CompletionRequest | ChatCompletionRequest) -> None:
    """As OpenAI: stream_options only with stream (a client asking for usage chunks of a
    response that has no chunks has made a mistake worth hearing about)."""
    if request.stream_options is not None and not request.stream:
        raise InvalidRequestError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )


def resembles(name: str, known: Iterable[str]) -> str | None:
    """The known field `name` is most likely a misspelling of: the same letters but for case,
    `-` or `_`, or one edit away (a letter added, dropped, changed or two swapped). Names under
    four letters are too short to tell."""
    if len(name) < 4:
        return None
    squashed = _squash(name)
    for field in sorted(known):
        if _squash(field) == squashed:
            return field
    for field in sorted(known):
        if len(field) >= 4 and _one_edit(name.lower(), field):
            return field
    return None


def _squash(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def _one_edit(a: str, b: str) -> bool:
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long = (a, b) if len(a) < len(b) else (b, a)
    i = next((k for k in range(len(short)) if short[k] != long[k]), len(short))
    return short[i:] == long[i + 1 :]


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


def client_chose_deadline(limits: RequestLimits, header_s: float | None) -> bool:
    """Whether the client's own deadline (X-Request-Timeout) is the one that applies."""
    server = limits.request_timeout_s
    return header_s is not None and header_s > 0 and (server is None or header_s <= server)
