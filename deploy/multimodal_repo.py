"""The CPU stand-in of TensorRT-LLM's multimodal repository, for a vision-language checkpoint.

Four models as upstream's C++ multimodal repository has them (``preprocessing`` ->
``multimodal_encoders`` -> ``tensorrt_llm`` -> ``postprocessing``, under the ensemble
``ensemble``): the preprocessing and the encoder run the checkpoint's own transformers processor,
vision tower and projector; the CPU reference engine reads the encoder's prompt table for the
prompt's image ids. As upstream's multimodal guide sets it, the engine leaves the prompt out of its
output (``exclude_input_in_output``), since the ensemble has no such input.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from deploy.model_repo import (
    TEMPLATES_DIR,
    render_repository,
    render_text,
    resolve_variables,
    validate_repository,
)

MULTIMODAL_TEMPLATES: Final = TEMPLATES_DIR / "multimodal"
# The models the multimodal repository renders from its own templates (the others are the text
# repository's, on the CPU reference engine).
MULTIMODAL_MODELS: Final = ("ensemble", "preprocessing", "multimodal_encoders")


def render_cpu_multimodal_repository(out_dir: Path, variables: Mapping[str, object]) -> Path:
    """Render the multimodal repository into ``out_dir`` (replacing it) and return it.

    ``variables`` are the CPU repository's template variables (``tokenizer_dir`` and ``model_dir``:
    the vision-language checkpoint)."""
    values: dict[str, object] = {
        **variables,
        "exclude_input_in_output": True,
        # The language model of a vision-language checkpoint is not where LoRA modules are looked
        # for (``model.layers``): LoRA is off.
        "lora_target_modules": "",
    }
    out_dir = render_repository(out_dir, backend="cpu", variant="current", variables=values, overwrite=True)
    resolved = resolve_variables("cpu", "current", values)
    prefix = str(resolved["name_prefix"])
    for model in MULTIMODAL_MODELS:
        src = MULTIMODAL_TEMPLATES / model
        dst = out_dir / f"{prefix}{model}"
        template = src / "config.pbtxt"
        text = render_text(template.read_text(), resolved, source=str(template.relative_to(TEMPLATES_DIR)))
        (dst / "1").mkdir(parents=True, exist_ok=True)
        for file in sorted((src / "1").glob("*.py")) if (src / "1").is_dir() else ():
            shutil.copyfile(file, dst / "1" / file.name)
        (dst / "config.pbtxt").write_text(text)
    validate_repository(out_dir)
    return out_dir
