"""Responses API wire models, named after their `object` / `type` values. Unknown fields are
accepted (the spec grows faster than any server); what the gateway does not use is ignored.

Input items are parsed one by one (`items.parse_input`) so that an error names the item
(`input[3].content[0].type`); the request keeps them as raw objects until then."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.apis.openai.protocol import PriorityFields

# ---------------------------------------------------------------- request


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ReasoningParam(_Open):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    # JSON schema of the answer (type json_schema); named `schema` on the wire.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextParam(_Open):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class StreamOptions(_Open):
    include_obfuscation: bool | None = None


# What `include` may ask for (the spec's IncludeEnum).
INCLUDE_VALUES = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)


# The body fields OpenAI defines (the spec's CreateResponse and TokenCountsBody): anything else a
# client sends is named back as ignored (Codex sends `client_metadata`, for one).
OPENAI_FIELDS = frozenset(
    (
        "background",
        "context_management",
        "conversation",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "moderation",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    )
)
INPUT_TOKENS_FIELDS = frozenset(
    (
        "conversation",
        "input",
        "instructions",
        "model",
        "parallel_tool_calls",
        "personality",
        "previous_response_id",
        "reasoning",
        "text",
        "tool_choice",
        "tools",
        "truncation",
    )
)


class CreateResponseRequest(PriorityFields, _Open):
    """POST /v1/responses. Python's JSON parser reads NaN and Infinity: no number may be either."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, populate_by_name=True)

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    max_output_tokens: Annotated[int, Field(ge=16)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    include: list[Literal[INCLUDE_VALUES]] | None = None  # type: ignore[valid-type]
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    reasoning: ReasoningParam | None = None
    background: bool | None = None
    # Not in OpenAI's API; what vLLM and SGLang accept beside it, and what chat completions takes.
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool | None = None
    # vLLM's guided decoding beyond text.format, as on chat completions: json, regex, choice, grammar.
    structured_outputs: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        # OpenAI's documented bounds: 16 pairs, keys up to 64 characters, values up to 512.
        if value is not None:
            if len(value) > 16:
                raise ValueError("metadata takes at most 16 key-value pairs")
            for key, item in value.items():
                if len(key) > 64 or len(item) > 512:
                    raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return value


class InputTokensRequest(_Open):
    """POST /v1/responses/input_tokens: the parts of a create request that make the prompt."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningParam | None = None
    truncation: Literal["auto", "disabled"] | None = None


# ---------------------------------------------------------------- input items


class InputText(_Open):
    type: Literal["input_text"]
    text: str


class OutputText(_Open):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list)
    logprobs: list[dict[str, Any]] = Field(default_factory=list)


class Refusal(_Open):
    type: Literal["refusal"] = "refusal"
    refusal: str


class ReasoningText(_Open):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class SummaryText(_Open):
    type: Literal["summary_text"] = "summary_text"
    text: str


class Message(_Open):
    """A message in `input`: a string or a list of parts (input_text for every role; output_text
    and refusal for earlier assistant turns)."""

    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCall(_Open):
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    call_id: Annotated[str, Field(min_length=1)]
    name: Annotated[str, Field(min_length=1)]
    namespace: str | None = None
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutput(_Open):
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    call_id: Annotated[str, Field(min_length=1, max_length=64)]
    # A string, or a list of input_text (image and file parts are refused by name).
    output: str | list[dict[str, Any]]
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class Reasoning(_Open):
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ItemReference(_Open):
    type: Literal["item_reference"] = "item_reference"
    id: str


InputItem = Message | FunctionCall | FunctionCallOutput | Reasoning | ItemReference

# ---------------------------------------------------------------- the response


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText | Refusal]


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class Response(BaseModel):
    """The response object: returned whole, streamed inside the lifecycle events, and stored."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[dict[str, Any]] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    # Left out, not null, until known: the published schema does not allow null here.
    usage: ResponseUsage | None = Field(default=None, exclude_if=lambda v: v is None)
    user: str | None = Field(default=None, exclude_if=lambda v: v is None)
    metadata: dict[str, str] = Field(default_factory=dict)
    background: bool = False
    service_tier: str = "default"
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class ResponseItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    has_more: bool
    first_id: str | None
    last_id: str | None


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputTokens(BaseModel):
    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int
