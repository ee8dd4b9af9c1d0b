"""/v1/chat/completions wire models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.apis.openai.protocol import CompletionUsage, GenerationFields


class TextContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="allow")
    # An http(s) URL or a data: URI.
    url: str
    # OpenAI's resolution hint: accepted; the model's processor decides the resolution.
    detail: Literal["auto", "low", "high"] | None = None


class ImageContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["image_url"]
    image_url: ImageURL


class OtherContentPart(BaseModel):
    """Audio, file parts: parsed so the error can name them, not served."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_audio", "file", "refusal"]


ContentPart = Annotated[TextContentPart | ImageContentPart | OtherContentPart, Field(discriminator="type")]


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
    # A reasoning model's thinking handed back with its turn (what this server returned as
    # `reasoning_content`; `reasoning` is the name newer vLLM servers use): the chat template
    # decides whether to render it (reasoning templates keep it only in an ongoing tool loop).
    reasoning_content: str | None = None
    reasoning: str | None = None


# OpenAI's values for `reasoning_effort` (the ReasoningEffort schema).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


# Every top-level field OpenAI's API reference defines for this request: a field named here
# is never "unrecognized", even where the gateway has no use for it (`store`, `metadata`, ...).
OPENAI_FIELDS = frozenset(
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


class ChatCompletionRequest(GenerationFields):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # Passed to the chat template as `reasoning_effort` (gpt-oss's and the test model's read it).
    reasoning_effort: ReasoningEffort | None = None
    # vLLM's extra variables for the chat template (e.g. {"enable_thinking": false}), passed as given.
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's guided decoding beyond response_format: one of `json`, `regex`, `choice`, `grammar`.
    structured_outputs: dict[str, Any] | None = None


class ChatCompletionMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    # A reasoning model's thinking (the model's reasoning_parser), as vLLM and SGLang return it;
    # left out when the model has none or did not think.
    reasoning_content: str | None = Field(default=None, exclude_if=lambda v: v is None)
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
