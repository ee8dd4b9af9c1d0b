"""/v1/score wire models, as vLLM defines them: `text_1` against `text_2` (one against many, or
pairwise)."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from gateway.apis.openai.protocol import PriorityFields


class ScoreRequest(PriorityFields):
    model_config = ConfigDict(extra="forbid")

    model: str
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    # vLLM's: false returns the raw logit instead of the model's activation (sigmoid) of it.
    use_activation: bool | None = None
    user: str | None = None


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreData]
    usage: ScoreUsage
