"""A scripted encoder for API tests: per-token states (or logits) made from the token ids by a rule
the tests can apply themselves, and a record of the batches it was sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.encoder import EncoderInfo, EncoderInput

WIDTH = 32


def token_state(token_id: int, position: int) -> np.ndarray:
    """The fake model's hidden state of one token: a fixed pseudo-random vector per (id, position)."""
    return np.random.default_rng(token_id * 1009 + position).standard_normal(WIDTH).astype(np.float32)


def pair_logit(ids: Sequence[int]) -> float:
    return float(sum(ids) % 97) / 10.0 - 4.0


@dataclass
class FakeEncoder:
    takes: str = "ids"
    returns: str = "tokens"
    max_batch_size: int = 3
    # A cross-encoder: one logit per input (returns "pooled").
    scores: bool = False
    batches: list[list[EncoderInput]] = field(default_factory=list)

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo(
            model="fake",
            takes=self.takes,  # type: ignore[arg-type]
            returns="pooled" if self.scores else self.returns,  # type: ignore[arg-type]
            max_batch_size=self.max_batch_size,
            width=1 if self.scores else WIDTH,
            output_name="logits" if self.scores else "last_hidden_state",
        )

    async def encode(self, inputs: Sequence[EncoderInput], *, affinity: str | None = None) -> list[Any]:
        out = []
        for start in range(0, len(inputs), self.max_batch_size):
            self.batches.append(list(inputs[start : start + self.max_batch_size]))
        for item in inputs:
            if self.scores:
                out.append(np.array([pair_logit(item.ids)], dtype=np.float32))
            else:
                out.append(np.stack([token_state(t, p) for p, t in enumerate(item.ids)]))
        return out

    async def is_ready(self) -> bool:
        return True

    async def ensure_ready(self) -> None:
        return None

    async def close(self) -> None:
        return None
