"""/tokenize and /detokenize wire models, as vLLM defines them (a prompt, or chat messages rendered
with the model's chat template)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TokenizeRequest(BaseModel):
    """vLLM's two tokenize requests in one: a `prompt`, or chat `messages` with the chat template."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    # None: as generation encodes it: a prompt with the tokenizer's default, a rendered chat
    # template with no special tokens added on top of what it writes.
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = False
    # Chat only.
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
