"""/v1/score: `text_1` (one text, or one per `text_2` entry) scored against each `text_2` entry."""

from __future__ import annotations

from gateway.apis.score.protocol import ScoreData, ScoreRequest, ScoreResponse, ScoreUsage
from gateway.core.encoders import EncoderService
from gateway.core.generation import new_id


class ScoreService(EncoderService):
    async def create(self, body: ScoreRequest, *, session: str | None = None) -> ScoreResponse:
        first = [body.text_1] if isinstance(body.text_1, str) else body.text_1
        second = [body.text_2] if isinstance(body.text_2, str) else body.text_2
        scored = await self.score_pairs(
            body.model,
            first,
            second,
            truncate=body.truncate_prompt_tokens,
            activate=body.use_activation is not False,
            affinity=session or body.user,
            query_param="text_1",
            document_param="text_2",
        )
        usage = ScoreUsage(prompt_tokens=scored.prompt_tokens, total_tokens=scored.prompt_tokens)
        data = [ScoreData(index=i, score=s) for i, s in enumerate(scored.scores)]
        return ScoreResponse(id=new_id("score"), model=body.model, data=data, usage=usage)
