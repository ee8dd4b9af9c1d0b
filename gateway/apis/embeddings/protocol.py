"""/v1/embeddings wire models, as OpenAI defines them, with vLLM's `truncate_prompt_tokens`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from gateway.apis.openai.protocol import PriorityFields

# Every top-level field OpenAI's API reference defines for this request.
OPENAI_FIELDS = frozenset(["input", "model", "encoding_format", "dimensions", "user"])


class EmbeddingRequest(PriorityFields):
    # Unknown fields are accepted (clients send many) and named back (apis.openai.fields).
    model_config = ConfigDict(extra="allow")

    model: str
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None
    # vLLM's: cut each input to this many tokens (-1: the model's limit) instead of refusing it.
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    # vLLM's: false encodes a text without the tokenizer's special tokens ([CLS], [SEP], BOS).
    add_special_tokens: bool = True


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    # A list of floats, or (encoding_format base64) the float32 little-endian bytes in base64.
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
