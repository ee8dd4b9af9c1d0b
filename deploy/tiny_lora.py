"""A random LoRA adapter (Hugging Face PEFT format) on a tiny model, to try adapters with no GPU.

    python -m deploy.tiny_lora --out /tmp/my-adapter [--kind agent] [--seed 1] [--hf-lora-convert]

The adapter's weights are rounded to float16 (what TensorRT-LLM receives) and its scaling is a power
of two, so the CPU engine and transformers + PEFT compute the same values. `--hf-lora-convert` also
writes the adapter as TensorRT-LLM's `hf_lora_convert.py` does (`model.lora_weights.npy`,
`model.lora_config.npy`) into `--out`/converted. Needs `peft` (the dev extra).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@contextlib.contextmanager
def peft_warnings() -> Iterator[None]:
    """peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing`: its warning, not ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


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
    with peft_warnings():
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


def main(argv: Sequence[str] | None = None) -> int:
    from deploy.tiny_model import ALL_KINDS, build_tiny_model

    parser = argparse.ArgumentParser(prog="python -m deploy.tiny_lora", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the adapter directory to write")
    parser.add_argument(
        "--kind", choices=ALL_KINDS, default="agent", help="tiny model (gateway dev's: agent)"
    )
    parser.add_argument("--model-dir", type=Path, default=None, help="another local HF model instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--hf-lora-convert", action="store_true", help="also write OUT/converted")
    args = parser.parse_args(argv)
    model_dir = args.model_dir or build_tiny_model(args.kind)
    make_peft_adapter(model_dir, args.out, args.seed, rank=args.rank, alpha=2 * args.rank)
    if args.hf_lora_convert:
        convert_like_hf_lora_convert(args.out, args.out / "converted")
    sys.stdout.write(f"{args.out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
