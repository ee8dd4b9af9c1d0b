"""How a vision-language model's processor expands the image placeholders its chat template
writes, read from the checkpoint's files (no transformers processor, no torch): the text the model
reads, whose ids are the prompt's count.

Gemma 3 (``model_type`` ``gemma3``): each ``<start_of_image>`` becomes ``"\\n\\n" +
<start_of_image> + image_seq_length x <image_soft_token> + <end_of_image> + "\\n\\n"``, whatever the
image (its processor resizes every image to one square).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# (prompt text with the template's placeholders, its images in order) -> the expanded text.
Expander = Callable[[str, Sequence[Any]], str]


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _gemma3(model_dir: Path, config: dict[str, Any]) -> Expander:
    tokenizer = _json(model_dir / "tokenizer_config.json")
    processor = _json(model_dir / "processor_config.json") or _json(model_dir / "preprocessor_config.json")
    boi = str(tokenizer.get("boi_token") or "<start_of_image>")
    eoi = str(tokenizer.get("eoi_token") or "<end_of_image>")
    image = str(tokenizer.get("image_token") or "<image_soft_token>")
    count = int(processor.get("image_seq_length") or config.get("mm_tokens_per_image") or 256)
    full = f"\n\n{boi}{image * count}{eoi}\n\n"

    def expand(text: str, images: Sequence[Any]) -> str:
        return text.replace(boi, full) if images else text

    return expand


_EXPANDERS: dict[str, Callable[[Path, dict[str, Any]], Expander]] = {"gemma3": _gemma3}


def image_expander(model_dir: str | Path) -> Expander | None:
    """The checkpoint's placeholder expansion, or None for a model without a vision tower or of an
    architecture not known here (its images then count as their placeholder text)."""
    model_dir = Path(model_dir)
    config = _json(model_dir / "config.json")
    if not isinstance(config.get("vision_config"), dict):
        return None
    build = _EXPANDERS.get(str(config.get("model_type", "")))
    return None if build is None else build(model_dir, config)


def takes_images(model_dir: str | Path) -> bool:
    """Whether the checkpoint has a vision tower (a ``vision_config`` in its config.json)."""
    return isinstance(_json(Path(model_dir) / "config.json").get("vision_config"), dict)
