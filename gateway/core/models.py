"""The served models: name -> tokenizer + engine + limits."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gateway.config import ServedModel
from gateway.engine import Engine
from gateway.errors import ModelNotFoundError
from gateway.logs import current_request
from gateway.text.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class ModelRuntime:
    config: ServedModel
    tokenizer: Tokenizer
    engine: Engine
    created: int

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def vocab_size(self) -> int:
        """The model's logits width (config.json may pad it past the tokenizer's)."""
        return self.tokenizer.info.model_vocab_size or self.tokenizer.vocab_size

    @property
    def max_model_len(self) -> int | None:
        if self.config.max_model_len is not None:
            return self.config.max_model_len
        return self.tokenizer.info.max_model_len


# How many served names a wrong model's 404 lists; the rest are one GET /v1/models away.
SHOWN_NAMES = 20


class ModelRegistry:
    def __init__(self, models: Iterable[ModelRuntime]) -> None:
        self._models = {m.name: m for m in models}

    def get(self, name: str) -> ModelRuntime:
        try:
            runtime = self._models[name]
        except KeyError:
            raise ModelNotFoundError(
                f"The model `{name}` does not exist or you do not have access to it. {self.served_names()}",
                param="model",
            ) from None
        record = current_request.get()
        if record is not None:
            record.model = name
        return runtime

    def served_names(self) -> str:
        """The served models as a sentence: what a client that named another should use."""
        names = [f"`{name}`" for name in self._models]
        shown = ", ".join(names[:SHOWN_NAMES])
        hidden = len(names) - SHOWN_NAMES
        more = f" and {hidden} more (GET /v1/models lists them)" if hidden > 0 else ""
        return f"This server serves {shown}{more}." if names else "This server serves no model."

    def __iter__(self) -> Iterator[ModelRuntime]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)
