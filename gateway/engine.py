"""The Engine protocol: what the core needs from a generation backend, in API-neutral terms.

The Triton adapter (`gateway.triton.engine.TritonAdapter`) implements it (whatever runs inside
Triton: TensorRT-LLM, or the CPU reference engine in model_repo_templates/); tests use a scripted
fake. Values are frozen slotted dataclasses so they are cheap and cannot be changed behind the
core's back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    # None means "not given": zero is a valid temperature (greedy).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    length_penalty: float | None = None
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log probability and, when asked for, the most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    # The output's first token (set by the core): where the text starts, a SentencePiece decoder
    # drops the token's leading space, and its text and bytes drop it too.
    starts_text: bool = False


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    # The text the ensemble tokenizes, and the ids the gateway computed from it (usage, context
    # check, the direct engine route). Both describe the same prompt.
    prompt_text: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    num_sequences: int = 1
    end_id: int | None = None
    pad_id: int | None = None
    # Extra end-of-generation ids and their token strings (generation_config eos lists).
    end_token_ids: tuple[int, ...] = ()
    end_token_strings: tuple[str, ...] = ()
    # Guided decoding: ("json" | "json_schema" | "regex" | "ebnf_grammar", guide text).
    guide: tuple[str, str] | None = None
    # None: no log probabilities; k >= 0: each token's, with the k most likely alternatives.
    logprobs: int | None = None
    # OpenAI logit_bias as (token id, bias) pairs, and the model's vocabulary size for the vector.
    logit_bias: tuple[tuple[int, float], ...] = ()
    vocab_size: int = 0
    # Keeps a conversation on one engine replica (prompt_cache_key, a session header, the user).
    affinity: str | None = None
    # Whether the client streams the answer: a text-only ensemble is then asked to stream too
    # (each response decoded alone); otherwise it returns one exact decode of the whole result.
    stream: bool = True
    # The request's priority (vLLM's convention: lower is more urgent, 0 the default), for an
    # engine that schedules by priority.
    priority: int = 0


# Not frozen: one is made per streamed token, and a frozen dataclass's __init__ (object.__setattr__
# per field) costs twice as much. Nothing changes one after it is made.
@dataclass(slots=True)
class GenerationDelta:
    """New output of one sequence. Exactly one of `token_ids` and `text` is set."""

    index: int
    token_ids: tuple[int, ...] | None = None
    text: bytes | None = None
    # Tokens this delta stands for (for text-only engines: the count the engine reports).
    num_tokens: int = 0
    # Engine-reported totals, when the model returns them.
    num_input_tokens: int | None = None
    # Prompt tokens whose KV cache the engine reused (not computed again), when it reports them.
    cached_tokens: int | None = None
    # One entry per token in `token_ids`, when log probabilities were asked for.
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What a served engine can do, learned from its model configuration at start-up."""

    model: str
    exposes_token_ids: bool
    native_num_sequences: bool
    reports_token_counts: bool
    variant: str
    # Whether the model streams (one response per token) or answers once per request.
    decoupled: bool = False
    guided_decoding: bool = False
    logprobs: bool = False
    top_logprobs: bool = False
    logit_bias: bool = False
    # Whether deltas carry `cached_tokens` (the engine reports its KV cache reuse), and its block size.
    cached_tokens: bool = False
    tokens_per_block: int | None = None
    # Whether requests must carry the prompt's token ids (the engine route sends them; a
    # non-streaming result that repeats the prompt is cut by their count). If not, the serving
    # layer may send a request before it has tokenized the prompt.
    needs_prompt_ids: bool = True
    # Whether a result starts with the prompt, for a streamed and a non-streamed request.
    repeats_prompt: tuple[bool, bool] = (False, False)
    inputs: frozenset[str] = field(default_factory=frozenset)
    outputs: frozenset[str] = field(default_factory=frozenset)
    # How requests reach the model ("engine": token ids; "ensemble": text) and why that way.
    route: str = ""
    route_reason: str = ""
    # The guided decoding backend the engine is set up with ("" when guided_decoding is false).
    guided_backend: str = ""
    # Whether a streamed answer's text is exact (a non-streamed one always is), and where the
    # completion token count comes from.
    exact_stream: bool = True
    usage_source: str = ""


class Engine(Protocol):
    @property
    def info(self) -> EngineInfo: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        """Stream deltas until every sequence is done. Closing the iterator early (`aclose`, or
        the consuming task being cancelled) must cancel the work in the engine."""
        ...

    async def is_ready(self) -> bool: ...

    async def ensure_ready(self) -> None:
        """Make `info` available (learn the model's contract if not yet known), or raise
        EngineUnavailableError."""
        ...

    async def close(self) -> None: ...
