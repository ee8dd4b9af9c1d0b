"""OpenAI request and response models (the subset this gateway serves), named after their `object`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------- requests

# Every top-level field OpenAI's API reference defines for each request: a field named here is
# never "unrecognized", even where the gateway has no use for it (`store`, `metadata`, ...).
OPENAI_CHAT_FIELDS = frozenset(
    [
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "metadata",
        "modalities",
        "model",
        "moderation",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    ]
)
OPENAI_COMPLETION_FIELDS = frozenset(
    [
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "model",
        "n",
        "presence_penalty",
        "prompt",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    ]
)
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
        "priority",
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


class _GenerationFields(BaseModel):
    """Fields shared by completions and chat completions, plus the engine's own knobs."""

    # Unknown fields are accepted (clients send many); the serving layer logs them once.
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


class CompletionRequest(_GenerationFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: str | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None


class TextContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class OtherContentPart(BaseModel):
    """Image, audio, file parts: parsed so the error can name them, not served."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url", "input_audio", "file", "refusal"]


ContentPart = Annotated[TextContentPart | OtherContentPart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_GenerationFields):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's extra knobs for chat templates.
    chat_template_kwargs: dict[str, Any] | None = None


# ---------------------------------------------------------------- responses


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    # Left out, not null, when there are none: the published schema does not allow null here.
    tool_calls: list[dict[str, Any]] | None = Field(default=None, exclude_if=lambda v: v is None)


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
