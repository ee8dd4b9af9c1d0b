"""The served models: name -> tokenizer + engine + limits; LoRA adapters are models over a base."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.config import ServedModel
from gateway.engine import Engine, ImageInput
from gateway.errors import GatewayError, ModelNotFoundError
from gateway.logs import current_request
from gateway.text.reply import reasoning_format_of
from gateway.text.tokenizer import Tokenizer

# (prompt text with the chat template's image placeholders, its images) -> the text the model reads.
ImageExpander = Callable[[str, Sequence[ImageInput]], str]


@dataclass(frozen=True, slots=True)
class ModelRuntime:
    config: ServedModel
    tokenizer: Tokenizer
    engine: Engine
    created: int
    # A LoRA adapter: its name (the model name clients use) and the base model it adapts.
    adapter: str | None = None
    parent: str | None = None
    # What the model's reasoning format built from its files at start-up (`ReasoningFormat.load`:
    # harmony's encoding for gpt-oss), handed to each reply parser; None: nothing.
    reply_encoding: Any = None
    # How the model's processor expands the image placeholders the chat template wrote into the
    # prompt the model reads (Gemma 3: each `<start_of_image>` into its 256 soft tokens and
    # their markers; Qwen2.5-VL: each `<|image_pad|>` into one per patch group of that image's
    # size): (rendered prompt text, its images in order) -> the expanded text. Prompts with
    # images are counted by encoding it (usage, context checks, /tokenize, count_tokens). None:
    # an image counts as the placeholder text alone.
    expand_images: ImageExpander | None = None

    @property
    def name(self) -> str:
        return self.adapter if self.adapter is not None else self.config.name

    @property
    def input_modalities(self) -> tuple[str, ...]:
        """What requests may carry: text, and images where the engine takes them (text alone
        while the engine's contract is not known yet)."""
        try:
            images = self.engine.info.images
        except GatewayError:
            images = False
        return ("text", "image") if images else ("text",)

    @property
    def vocab_size(self) -> int:
        """The model's logits width (config.json may pad it past the tokenizer's)."""
        return self.tokenizer.info.model_vocab_size or self.tokenizer.vocab_size

    @property
    def max_model_len(self) -> int | None:
        if self.config.max_model_len is not None:
            return self.config.max_model_len
        return self.tokenizer.info.max_model_len


def load_reply_encoding(model: ServedModel, state_dir: Path) -> Any:
    """What the model's reply format builds from its files (`ReasoningFormat.load`: harmony's
    encoding for gpt-oss, kept under ``state_dir/cache``), or None; a ServerConfigError for a
    model the format cannot read. Once at start-up: a load is memoized."""
    fmt = reasoning_format_of(model.reasoning_parser, model.tool_parser)
    if fmt is None or fmt.load is None:
        return None
    return fmt.load(Path(model.tokenizer), state_dir / "cache")


# How many served names a wrong model's 404 lists; the rest are one GET /v1/models away.
SHOWN_NAMES = 20


class ModelRegistry:
    """Base models by name, and adapters by name or as `BASE:ADAPTER` (SGLang's spelling)."""

    def __init__(self, models: Iterable[ModelRuntime], adapters: Iterable[ModelRuntime] = ()) -> None:
        self._models = {m.name: m for m in models}
        self._adapters = {a.name: a for a in adapters}

    def get(self, name: str) -> ModelRuntime:
        runtime = self._models.get(name) or self._adapters.get(name)
        if runtime is None:
            base, sep, adapter = name.partition(":")
            found = self._adapters.get(adapter) if sep else None
            if found is not None and found.parent == base:
                runtime = found
        if runtime is None:
            raise ModelNotFoundError(
                f"The model `{name}` does not exist or you do not have access to it. {self.served_names()}",
                param="model",
            ) from None
        record = current_request.get()
        if record is not None:
            record.model = runtime.name
        return runtime

    def served_names(self) -> str:
        """The served models as a sentence: what a client that named another should use."""
        names = [f"`{name}`" for name in [*self._models, *self._adapters]]
        shown = ", ".join(names[:SHOWN_NAMES])
        hidden = len(names) - SHOWN_NAMES
        more = f" and {hidden} more (GET /v1/models lists them)" if hidden > 0 else ""
        return f"This server serves {shown}{more}." if names else "This server serves no model."

    def base(self, name: str) -> ModelRuntime | None:
        return self._models.get(name)

    def adapter(self, name: str) -> ModelRuntime | None:
        return self._adapters.get(name)

    def add_adapter(self, runtime: ModelRuntime) -> None:
        self._adapters[runtime.name] = runtime

    def remove_adapter(self, name: str) -> ModelRuntime | None:
        return self._adapters.pop(name, None)

    @property
    def adapters(self) -> list[ModelRuntime]:
        return list(self._adapters.values())

    def __iter__(self) -> Iterator[ModelRuntime]:
        """The base models (what readiness and start-up introspection go over)."""
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)
