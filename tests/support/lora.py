"""Random LoRA adapters on the tiny model (made with PEFT) and their transformers + PEFT reference.

The adapters' weights are rounded to float16 (what the backend receives) and their scaling is a power
of two, so the reference and the engine compute the same values.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_peft_adapter(
    model_dir: Path,
    out_dir: Path,
    seed: int,
    *,
    rank: int = 8,
    alpha: int = 16,
    use_rslora: bool = False,
    modules: Sequence[str] = LLAMA_MODULES,
) -> Path:
    """A random PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) in `out_dir`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(modules),
        lora_dropout=0.0,
        use_rslora=use_rslora,
        # False: random A and B (PEFT's default B is zero, an adapter that changes nothing).
        init_lora_weights=False,
    )
    with _peft_warnings():
        peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(parameter.half().float())
    peft_model.save_pretrained(out_dir)
    return out_dir


def convert_like_hf_lora_convert(peft_dir: Path, out_dir: Path) -> Path:
    """The adapter as TensorRT-LLM's hf_lora_convert.py writes it: model.lora_weights.npy
    [1, N, W] float16 and model.lora_config.npy [1, N, 3] int32."""
    from gateway.lora import convert_peft

    weights, config = convert_peft(peft_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / "model.lora_weights.npy", weights[None])
    np.save(out_dir / "model.lora_config.npy", config[None])
    return out_dir


@contextlib.contextmanager
def _peft_warnings() -> Iterator[None]:
    """peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing`: its warning, not ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


@cache
def _model(model_dir: Path, adapter_dir: Path | None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # Exactly max_tokens tokens: no end id.
    model.generation_config.eos_token_id = None
    if adapter_dir is not None:
        from peft import PeftModel

        with _peft_warnings():
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
