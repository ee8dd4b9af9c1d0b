"""Anthropic Messages API wire models (the subset this gateway serves), named after their `type`.

Unknown fields are accepted and ignored, as the issue and real agents need: Claude Code sends
`context_management`, `cache_control` on blocks, `service_tier`, `speed`, `container`, betas
that grow every month. Block types that carry inputs this gateway cannot serve (documents, ...)
are parsed so the error can name them; a type nobody defines is a validation error.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------- request content blocks


class _Block(BaseModel):
    # `cache_control`, `citations` and the like are accepted on every block and ignored.
    model_config = ConfigDict(extra="allow")


class TextBlockParam(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlockParam(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlockParam(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultContent] | None = None
    is_error: bool | None = None


class ThinkingBlockParam(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockParam(_Block):
    type: Literal["redacted_thinking"]
    data: str


class ToolReferenceBlockParam(_Block):
    """What Claude Code's ToolSearch returns: a deferred tool (`defer_loading`) made available."""

    type: Literal["tool_reference"]
    tool_name: str


class Base64ImageSource(_Block):
    type: Literal["base64"]
    media_type: str
    data: str


class URLImageSource(_Block):
    type: Literal["url"]
    url: str


class FileImageSource(_Block):
    """An image uploaded through Anthropic's Files API: parsed so the 400 can name it."""

    type: Literal["file"]
    file_id: str


ImageSource = Annotated[Base64ImageSource | URLImageSource | FileImageSource, Field(discriminator="type")]


class ImageBlockParam(_Block):
    type: Literal["image"]
    source: ImageSource


class UnservedBlockParam(_Block):
    """Blocks Anthropic defines whose inputs this gateway cannot give a text model; parsed only
    so that the 400 can name them."""

    type: Literal[
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "container_upload",
    ]


ToolResultContent = Annotated[
    TextBlockParam | ImageBlockParam | ToolReferenceBlockParam | UnservedBlockParam,
    Field(discriminator="type"),
]

ContentBlockParam = Annotated[
    TextBlockParam
    | ToolUseBlockParam
    | ToolResultBlockParam
    | ThinkingBlockParam
    | RedactedThinkingBlockParam
    | ImageBlockParam
    | UnservedBlockParam,
    Field(discriminator="type"),
]

ToolResultBlockParam.model_rebuild()


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    # "system" in the middle of a conversation is what Claude Code sends with the
    # mid-conversation-system beta; it is rendered as a system turn where it stands.
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlockParam]


# ---------------------------------------------------------------- tools and controls


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    # Absent or "custom" for a client tool; anything else is one of Anthropic's server tools.
    type: str | None = None
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoiceAuto(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["none"]


ToolChoiceParam = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class ThinkingEnabled(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["enabled"]
    budget_tokens: int
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingBetweenTools(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["between_tools"]


class ThinkingDisabled(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["disabled"]


ThinkingConfigParam = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingBetweenTools | ThinkingDisabled,
    Field(discriminator="type"),
]


class JSONOutputFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JSONOutputFormat | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    user_id: str | None = None


# ---------------------------------------------------------------- requests


class MessageCountTokensRequest(BaseModel):
    """What `/v1/messages/count_tokens` takes: everything that shapes the prompt."""

    # Python's JSON parser reads NaN and Infinity: no sampling knob may be either.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[TextBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingConfigParam | None = None
    output_config: OutputConfig | None = None


class MessageCreateRequest(MessageCountTokensRequest):
    # Required, as Anthropic requires it.
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    metadata: Metadata | None = None
    # Gone from the current SDK's signature but still sent by older clients (and reachable
    # through `extra_body`): honoured when given, else the model's own generation defaults.
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    # The engine's own knob, accepted here as on the OpenAI endpoints (benchmarks use it).
    ignore_eos: bool | None = None
    # Anthropic's `service_tier`: `auto` (the API key's default priority) or `standard_only`
    # (never the priority tier: no more urgent than the default, 0); other values are taken as
    # `auto`, as agents send values this gateway cannot know yet. `priority` is vLLM's field,
    # taken as on the OpenAI endpoints (lower is more urgent) and winning over `service_tier`.
    service_tier: str | None = None
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    # vLLM's guided decoding beyond `output_config.format`, as chat completions take it: one of
    # `json`, `regex`, `choice`, `grammar`.
    structured_outputs: dict[str, Any] | None = None

    def admission_priority(self, default: int) -> int:
        """Which requests go first when the gateway's admission queue is full."""
        if self.priority is not None:
            return self.priority
        if self.service_tier == "standard_only":
            return max(default, 0)
        return default


# ---------------------------------------------------------------- responses


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    # Anthropic signs thinking so it can be handed back unchanged; this gateway does not check
    # what is handed back, so it signs nothing.
    signature: str = ""


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = Annotated[TextBlock | ThinkingBlock | ToolUseBlock, Field(discriminator="type")]

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(BaseModel):
    """Anthropic's usage (see `stream.usage`): None where the engine does not report its KV cache
    reuse, which Anthropic's schema writes as null."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: Usage


class MessageTokensCount(BaseModel):
    input_tokens: int


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail
