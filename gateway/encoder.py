"""The Encoder protocol: what the core needs from a model that embeds or scores its input (an
encoder, not a generator), in API-neutral terms, beside the `Engine` protocol.

`gateway.triton.encoder.TritonEncoder` implements it over a Triton encoder model (token ids or text
in; per-token hidden states, one vector per input, or a classifier's logits out), the layout read
from the model config at start-up. Tests use a fake.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# What a model takes: token ids (`input_ids`, `attention_mask`, maybe `token_type_ids`), or text.
EncoderInputKind = Literal["ids", "text"]
# What it returns for each input: one vector per token (hidden states the gateway pools), or one
# vector (a pooled embedding, or a classifier's logits).
EncoderOutputKind = Literal["tokens", "pooled"]


@dataclass(frozen=True, slots=True)
class EncoderInfo:
    """What a served encoder model takes and returns, learned from its model config at start-up."""

    model: str
    takes: EncoderInputKind
    returns: EncoderOutputKind
    # Inputs sent in one Triton request (the model's max_batch_size; 1 for a model without batching).
    max_batch_size: int
    # The output's last dimension when the config fixes it (the embedding size, the labels).
    width: int | None = None
    # The longest input the config allows, when it fixes the sequence dimension.
    max_length: int | None = None
    token_types: bool = False
    inputs: frozenset[str] = field(default_factory=frozenset)
    outputs: frozenset[str] = field(default_factory=frozenset)
    # The tensor names chosen: input ids (or text), the output read.
    input_name: str = ""
    output_name: str = ""


@dataclass(frozen=True, slots=True)
class EncoderInput:
    """One input: its token ids (with token types for a pair), or its text for a text-in model."""

    ids: tuple[int, ...] = ()
    type_ids: tuple[int, ...] | None = None
    text: str | None = None


class Encoder(Protocol):
    @property
    def info(self) -> EncoderInfo: ...

    async def encode(self, inputs: Sequence[EncoderInput], *, affinity: str | None = None) -> list[Any]:
        """One float32 numpy array per input, in order: [tokens, hidden] per-token states (only
        the input's own tokens) or [width] for a pooled output. Inputs are batched into requests
        of at most `info.max_batch_size`."""
        ...

    async def is_ready(self) -> bool: ...

    async def ensure_ready(self) -> None:
        """Make `info` available (read the model config if not yet read), or raise
        EngineUnavailableError (or ServerConfigError for a model the gateway cannot serve)."""
        ...

    async def close(self) -> None: ...
