"""/v1/score wire models, as vLLM defines them: `text_1` against `text_2` (one against many, or
pairwise), or the same as `queries` and `documents` (or `items`), or `data_1` and `data_2`."""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from gateway.apis.openai.protocol import ActivationFields, PriorityFields
from gateway.errors import InvalidRequestError

Texts = StrictStr | list[StrictStr]

# vLLM's names for the two sides, in the order it reads them.
PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))

SCORE_FIELDS = frozenset(
    [
        "model",
        *(name for pair in PAIRS for name in pair),
        "truncate_prompt_tokens",
        "use_activation",
        "softmax",
        "activation",
        "user",
        "priority",
        "service_tier",
    ]
)


class ScoreRequest(PriorityFields, ActivationFields):
    # Unknown fields are accepted and named back (apis.openai.fields).
    model_config = ConfigDict(extra="allow")

    model: str
    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    user: str | None = None

    def sides(self) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """The two sides as (field name, texts): the first pair of vLLM's names the body gives."""
        names = dict.fromkeys(n for pair in PAIRS for n in pair)
        given = [name for name in names if getattr(self, name) is not None]
        for first, second in PAIRS:
            if first in given and second in given:
                used = {first, second}
                extra = [name for name in given if name not in used]
                if extra:
                    raise InvalidRequestError(
                        f"give the texts as {first} and {second} alone, not with {', '.join(extra)}",
                        param=extra[0],
                    )
                return (first, _listed(getattr(self, first))), (second, _listed(getattr(self, second)))
        raise InvalidRequestError(
            "give the texts to score as text_1 and text_2 (or queries and documents)",
            param="text_2" if "text_1" in given else "text_1",
        )


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


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
