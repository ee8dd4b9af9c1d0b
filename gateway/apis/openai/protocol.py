"""Wire models every OpenAI API here shares: the sampling fields of a generation request, usage,
the error body. Each API's own models live in its folder."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------- requests

# Fields other OpenAI-compatible servers and routers define (vLLM, SGLang, OpenRouter, LiteLLM)
# that agent frameworks pass through: ignored like OpenAI's, and never taken for a misspelling
# of a field they happen to resemble (`min_p` and `top_p`, `top_a` and `top_k`).
KNOWN_EXTENSION_FIELDS = frozenset(
    [
        "top_k",
        "min_p",
        "top_a",
        "repetition_penalty",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "bad_words",
        "echo",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "documents",
        "chat_template",
        "chat_template_kwargs",
        "mm_processor_kwargs",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "structured_outputs",
        "structural_tag",
        "request_id",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "cache_salt",
        "kv_transfer_params",
        "vllm_xargs",
        "use_beam_search",
        "logits_processors",
        "regex",
        "json_schema",
        "ebnf",
        "lora_path",
        "no_stop_trim",
        "separate_reasoning",
        "stream_reasoning",
        "transforms",
        "models",
        "route",
        "provider",
        "reasoning",
        "usage",
        "include_reasoning",
        "plugins",
        "mock_response",
        "caching",
        "tags",
        "thinking",
        "extra_headers",
        "extra_body",
        "timeout",
        "num_retries",
    ]
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


# OpenAI's service tiers as admission priorities (vLLM's convention: lower is more urgent; 0 is
# the default). `auto` is "the project's setting": here, the API key's default priority.
SERVICE_TIER_PRIORITY: dict[str, int] = {
    "priority": -10,
    "fast": -10,  # OpenAI answers a request for `fast` with `priority`
    "ultrafast": -10,
    "scale": -5,
    "default": 0,
    "flex": 10,
}
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]
# vLLM's priority field: any integer; here bounded to 32 bits.
Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


class PriorityFields(BaseModel):
    """Which requests go first when the gateway's admission queue is full: `priority` (vLLM's
    field) wins over `service_tier` (OpenAI's), which wins over the API key's default."""

    priority: Priority | None = None
    service_tier: ServiceTier | None = None

    def admission_priority(self, default: int) -> int:
        if self.priority is not None:
            return self.priority
        if self.service_tier is None or self.service_tier == "auto":
            return default
        return SERVICE_TIER_PRIORITY[self.service_tier]


class ActivationFields(BaseModel):
    """Whether a cross-encoder's score is its activation (sigmoid) of the logit, as vLLM's pooling
    requests ask (rerank, score)."""

    # vLLM's: false returns the raw logit instead of the model's activation (sigmoid) of it.
    use_activation: bool | None = None
    # vLLM's earlier names for use_activation, which its clients still send.
    softmax: bool | None = None
    activation: bool | None = None

    @property
    def activate(self) -> bool:
        """vLLM's order: use_activation, then softmax, then activation; true unless one says no."""
        for value in (self.use_activation, self.softmax, self.activation):
            if value is not None:
                return value
        return True


class GenerationFields(PriorityFields):
    """Fields shared by completions and chat completions, plus the engine's own knobs."""

    # Unknown fields are accepted (clients send many) and named back (apis.openai.fields).
    # Python's JSON parser reads NaN and Infinity: no sampling knob may be either.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Routing hints (OpenAI's prompt-caching fields): requests sharing one go to the same replica.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # Fields OpenAI defines that change the result; rejected by name until supported.
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None
    # TensorRT-LLM knobs, as vLLM accepts them in the body ("extra_body" in the SDK).
    # Sent as an INT32 tensor.
    top_k: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    length_penalty: float | None = None
    ignore_eos: bool | None = None
    # vLLM's: each prompt token's log probability with this many alternatives (the first has none).
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


# ---------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Only when the engine reports its KV cache reuse: absent, never a made-up zero.
    prompt_tokens_details: PromptTokensDetails | None = Field(default=None, exclude_if=lambda v: v is None)
    # Only for a model with a reasoning parser (whose thinking is counted).
    completion_tokens_details: CompletionTokensDetails | None = Field(
        default=None, exclude_if=lambda v: v is None
    )

    @classmethod
    def of(
        cls,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None,
        reasoning_tokens: int | None = None,
    ) -> CompletionUsage:
        details = None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
        completion = (
            None if reasoning_tokens is None else CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
        )
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=details,
            completion_tokens_details=completion,
        )


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
