"""Rerank: a query against each document through the cross-encoder core, sorted by relevance."""

from __future__ import annotations

from gateway.apis.openai.fields import ignored_fields, note_ignored_fields
from gateway.apis.rerank.protocol import (
    RERANK_FIELDS,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
)
from gateway.core.encoders import EncoderService
from gateway.core.generation import new_id


class RerankService(EncoderService):
    async def create(self, body: RerankRequest, *, session: str | None = None) -> RerankResponse:
        note_ignored_fields(ignored_fields(body, RERANK_FIELDS, strict=self._limits.reject_unknown_fields))
        texts = [d if isinstance(d, str) else d.text for d in body.documents]
        scored = await self.score_pairs(
            body.model,
            [body.query],
            texts,
            truncate=body.truncate_prompt_tokens,
            activate=body.activate,
            affinity=session or body.user,
        )
        order = sorted(range(len(texts)), key=lambda i: scored.scores[i], reverse=True)
        if body.top_n:
            order = order[: body.top_n]
        results = [
            RerankResult(
                index=i,
                relevance_score=scored.scores[i],
                document=RerankDocument(text=texts[i]) if body.return_documents else None,
            )
            for i in order
        ]
        return RerankResponse(
            id=new_id("rerank"),
            model=body.model,
            usage=RerankUsage(prompt_tokens=scored.prompt_tokens, total_tokens=scored.prompt_tokens),
            results=results,
        )
