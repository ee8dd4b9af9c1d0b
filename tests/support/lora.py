"""Random LoRA adapters on the tiny model (made with PEFT) and their transformers + PEFT reference.

The adapters' weights are rounded to float16 (what the backend receives) and their scaling is a power
of two, so the reference and the engine compute the same values.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from deploy.tiny_lora import convert_like_hf_lora_convert, make_peft_adapter, peft_warnings

__all__ = ["convert_like_hf_lora_convert", "make_peft_adapter", "reference_greedy", "write_numpy_adapter"]

PEFT_PREFIX = "base_model.model.model.layers"


def write_numpy_adapter(path: Path, *, rank: int = 2, seed: int = 0, hidden: int = 64) -> Path:
    """A small PEFT directory written with numpy alone (q_proj of two layers): no torch needed."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in (0, 1):
        tensors[f"{PEFT_PREFIX}.{layer}.self_attn.q_proj.lora_A.weight"] = rng.standard_normal(
            (rank, hidden)
        ).astype(np.float32)
        tensors[f"{PEFT_PREFIX}.{layer}.self_attn.q_proj.lora_B.weight"] = rng.standard_normal(
            (hidden, rank)
        ).astype(np.float32)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank})
    )
    return path


@cache
def _model(model_dir: Path, adapter_dir: Path | None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # Exactly max_tokens tokens: no end id.
    model.generation_config.eos_token_id = None
    if adapter_dir is not None:
        from peft import PeftModel

        with peft_warnings():
            model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    return model


def reference_greedy(
    model_dir: Path, adapter_dir: Path | None, prompt_ids: list[int], max_tokens: int
) -> list[int]:
    """transformers + PEFT greedy generate for exactly `max_tokens` tokens (no end id)."""
    import torch

    model = _model(model_dir, adapter_dir)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([prompt_ids]),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    generated = out[0, len(prompt_ids) :].tolist()
    assert len(generated) == max_tokens
    return [int(t) for t in generated]
