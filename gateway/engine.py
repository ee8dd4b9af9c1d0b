"""The Engine protocol: what the core needs from a generation backend, in API-neutral terms.

Two Triton adapters implement it, one per TensorRT-LLM contract: `gateway.triton.engine.TritonAdapter`
(the C++ repository: ensemble or engine model) and `gateway.triton.llmapi_engine.LlmapiAdapter` (the
`llmapi` Python model); `gateway.triton.models.TritonModel` picks one from the model config. Tests
use a scripted fake. Values are frozen slotted dataclasses so they are cheap and cannot be changed behind the
core's back.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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
    # The token's rank in its distribution (1: the most likely), where the engine computed it.
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class LoraTensors:
    """An adapter's backend tensors (`gateway.lora.AdapterTensors`): `weights` [N, W] float16,
    `config` [N, 3] int32, and the task id derived from them."""

    task_id: int
    weights: Any
    config: Any


@dataclass(frozen=True, slots=True, eq=False)
class LoraRequest:
    """The LoRA adapter a request runs with. The engine sends `task_id` alone; when the backend
    no longer holds the adapter it calls `tensors` (which may read the files again) and sends
    the weights once more, then `on_miss` counts it."""

    name: str
    task_id: int
    tensors: Callable[[], Awaitable[LoraTensors]]
    # The adapter as the Triton server sees it (a PEFT directory), for models that load it there.
    server_path: str | None = None
    on_miss: Callable[[], None] | None = None


# The image types a request may carry (OpenAI's and Anthropic's lists): PNG, JPEG, WebP, GIF.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a request, as `gateway.media` hands it over: fetched (or decoded from a data:
    URI or base64 block), its type sniffed from the bytes and its size read from the header, all
    within the configured caps. `data` is the file as the client sent it, not decoded pixels."""

    data: bytes = field(repr=False)
    # One of IMAGE_TYPES: what the bytes are (sniffed), not what the client declared.
    mime_type: str
    width: int
    height: int
    # Where it came from: "data" (a data: URI or a base64 block) or the URL it was fetched from
    # (the last one, after redirects).
    source: str

    def data_uri(self) -> str:
        """The image as a `data:` URI (what the llmapi model's `image_url` input takes)."""
        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode('ascii')}"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    # The text the ensemble tokenizes, and the ids the gateway computed from it (usage, context
    # check, the direct engine route). Both describe the same prompt.
    prompt_text: str
    # A tuple, or for a long prompt TokenIds (one int32 array: text.ids) that the Triton request
    # takes without a Python int per token.
    prompt_ids: Sequence[int]
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
    # None: no prompt log probabilities; k >= 0: each prompt token's (the first has none), with the
    # k most likely alternatives (needs EngineInfo.prompt_logprobs).
    prompt_logprobs: int | None = None
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
    # The LoRA adapter to run with (None: the base model).
    lora: LoraRequest | None = None
    # The prompt's images in prompt order: the i-th fills the i-th image placeholder the chat
    # template wrote into `prompt_text` (empty for a text prompt). Only sent to an engine whose
    # info says `images`.
    images: tuple[ImageInput, ...] = ()
    # With images: the conversation as one question (`gateway.core.prompt.image_question`), for an
    # engine that renders the chat template itself around it; None where it is not one.
    question: str | None = None


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
    # Why the engine ended this sequence ("stop", "length"), on its last delta, when it says.
    finish_reason: str | None = None
    # The prompt's log probabilities (one per prompt token, the first None), once per request on
    # one of its deltas, when the request asked for them.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


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
    # Whether the engine scores the prompt (context logits): echo with logprobs, prompt_logprobs.
    prompt_logprobs: bool = False
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
    # Whether requests on this route can carry a LoRA adapter, and the engine's LoRA modules
    # (`lora_target_modules` as module ids; None: not declared, any module is sent).
    lora: bool = False
    lora_target_modules: tuple[int, ...] | None = None
    # Whether the model loads adapters itself from a path on the Triton server (the llmapi
    # model's `lora_path`) rather than taking their weights in the request.
    lora_by_server_path: bool = False
    # Whether the engine tokenizes the prompt text itself and adds the tokenizer's special tokens
    # (BOS): a BOS the chat template wrote is then left out of the text sent, and prompts are
    # counted with special tokens added, as the engine counts them.
    adds_special_tokens: bool = False
    # Whether deltas carry no token counts at all: completion tokens are then counted by encoding
    # the generated text again (usage_source says so).
    counts_text: bool = False
    # The sampling parameters (SamplingParams field names) the engine takes; None: all of them.
    # A request setting any other is refused, naming it.
    sampling: frozenset[str] | None = None
    # Whether the model takes images (GenerationRequest.images); without it every API answers an
    # image with a 400 before fetching anything.
    images: bool = False
    # How many images one request may carry (None: any number; the C++ multimodal repository up
    # to TensorRT-LLM v0.19 takes one).
    images_per_request: int | None = None
    # Whether the engine renders the chat template itself around one question and its images
    # (the llmapi model's `image_url`): an image request must then be one
    # (`GenerationRequest.question`).
    images_as_question: bool = False


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


@runtime_checkable
class LoraRoutes(Protocol):
    """An engine whose LoRA requests may need another route than its own (an ensemble that does
    not pass LoRA inputs on: its engine model takes them)."""

    async def lora_engine(self) -> Engine:
        """The engine that serves this model's LoRA requests (ready), or raise a GatewayError
        saying why none can."""
        ...
