"""/v1/embeddings: inputs (text or token ids, one or many) -> the encoder core -> an embedding list,
floats or base64."""

from __future__ import annotations

import base64

import numpy as np

from gateway.apis.embeddings.protocol import (
    OPENAI_FIELDS,
    Embedding,
    EmbeddingList,
    EmbeddingRequest,
    EmbeddingUsage,
)
from gateway.apis.openai.fields import ignored_fields, note_ignored_fields
from gateway.core.encoders import EncoderService, Text


class EmbeddingsService(EncoderService):
    async def create(self, body: EmbeddingRequest, *, session: str | None = None) -> EmbeddingList:
        note_ignored_fields(ignored_fields(body, OPENAI_FIELDS, strict=self._limits.reject_unknown_fields))
        encoded = await self.embed(
            body.model,
            _inputs(body.input),
            dimensions=body.dimensions,
            truncate=body.truncate_prompt_tokens,
            affinity=session or body.user,
            add_special_tokens=body.add_special_tokens,
        )
        data = [
            Embedding(index=i, embedding=_encode(v, body.encoding_format))
            for i, v in enumerate(encoded.vectors)
        ]
        usage = EmbeddingUsage(prompt_tokens=encoded.prompt_tokens, total_tokens=encoded.prompt_tokens)
        return EmbeddingList(data=data, model=body.model, usage=usage)


def _inputs(value: str | list[str] | list[int] | list[list[int]]) -> list[Text]:
    """OpenAI's four input shapes as a list of inputs: a list of ints is one input's token ids."""
    if isinstance(value, str):
        return [value]
    if value and isinstance(value[0], int):
        return [value]
    return list(value)  # type: ignore[arg-type]


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        # What OpenAI's SDK decodes: float32, little-endian.
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()
