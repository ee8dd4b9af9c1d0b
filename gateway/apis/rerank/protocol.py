"""Rerank wire models: Cohere's and Jina's request (a query, documents, top_n) as vLLM serves it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from gateway.apis.openai.protocol import ActivationFields, PriorityFields

# The fields this request defines: Cohere's, Jina's and vLLM's that the gateway serves. Other
# fields are accepted and named back (apis.openai.fields), as on the OpenAI endpoints.
RERANK_FIELDS = frozenset(
    [
        "model",
        "query",
        "documents",
        "top_n",
        "return_documents",
        "truncate_prompt_tokens",
        "use_activation",
        "softmax",
        "activation",
        "user",
        "max_chunks_per_doc",
        "priority",
        "service_tier",
    ]
)


class DocumentObject(BaseModel):
    """Jina's and Cohere's document as an object."""

    model_config = ConfigDict(extra="allow")

    text: StrictStr


class RerankRequest(PriorityFields, ActivationFields):
    # Unknown fields are accepted (Cohere's and Jina's clients send their own) and named back.
    model_config = ConfigDict(extra="allow")

    model: str
    query: StrictStr
    documents: list[StrictStr | DocumentObject]
    # 0 or none: every document.
    top_n: Annotated[int, Field(ge=0)] | None = None
    return_documents: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    user: str | None = None
    # Cohere's; the gateway never splits a document, so its bound is the model's input limit.
    max_chunks_per_doc: int | None = None


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    object: Literal["rerank"] = "rerank"
    model: str
    usage: RerankUsage
    results: list[RerankResult]
