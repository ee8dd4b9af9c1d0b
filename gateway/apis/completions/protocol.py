"""/v1/completions wire models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from gateway.apis.openai.protocol import CompletionUsage, GenerationFields

# Every top-level field OpenAI's API reference defines for this request: a field named here
# is never "unrecognized", even where the gateway has no use for it (`store`, `metadata`, ...).
OPENAI_FIELDS = frozenset(
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


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 with `echo` scores the prompt without generating (OpenAI's legacy API, vLLM).
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    echo: bool | None = False
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: str | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None
    # vLLM's, only when asked for: per prompt token {token id: {logprob, rank, decoded_token}},
    # the first None.
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None

    @model_serializer(mode="wrap")
    def _leave_out_unasked(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("prompt_logprobs") is None:
            out.pop("prompt_logprobs", None)
        return out


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
