"""/v1/score: `text_1` (one text, or one per `text_2` entry) scored against each `text_2` entry."""

from __future__ import annotations

from gateway.apis.openai.fields import ignored_fields, note_ignored_fields
from gateway.apis.score.protocol import SCORE_FIELDS, ScoreData, ScoreRequest, ScoreResponse, ScoreUsage
from gateway.core.encoders import EncoderService
from gateway.core.generation import new_id


class ScoreService(EncoderService):
    async def create(self, body: ScoreRequest, *, session: str | None = None) -> ScoreResponse:
        note_ignored_fields(ignored_fields(body, SCORE_FIELDS, strict=self._limits.reject_unknown_fields))
        (first_name, first), (second_name, second) = body.sides()
        scored = await self.score_pairs(
            body.model,
            first,
            second,
            truncate=body.truncate_prompt_tokens,
            activate=body.activate,
            affinity=session or body.user,
            query_param=first_name,
            document_param=second_name,
        )
        usage = ScoreUsage(prompt_tokens=scored.prompt_tokens, total_tokens=scored.prompt_tokens)
        data = [ScoreData(index=i, score=s) for i, s in enumerate(scored.scores)]
        return ScoreResponse(id=new_id("score"), model=body.model, data=data, usage=usage)
