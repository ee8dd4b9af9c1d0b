"""Render a Triton repository for an encoder model (embeddings, or a cross-encoder for rerank and
score) with the config.pbtxt its export has: ONNX Runtime (`model.onnx`), TensorRT (`model.plan`),
or the CPU stand-in (Python backend, torch) with the same tensors.

``python -m deploy.encoder_repo --model-dir HF_DIR --out DIR [--backend onnxruntime|tensorrt|python]
[--task embed|score] [--name NAME] [--text-model]``: the gateway then serves it with
``--model name=NAME,triton_model=NAME,tokenizer=HF_DIR``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.model_repo import parse_model_config

TEMPLATE = Path(__file__).resolve().parent.parent / "model_repo_templates" / "encoder" / "model.py"
BACKENDS = ("onnxruntime", "tensorrt", "python")
# What Triton's backends call the model file in a version directory.
MODEL_FILES = {"onnxruntime": "model.onnx", "tensorrt": "model.plan", "python": "model.py"}


def _hf_config(model_dir: Path) -> dict[str, object]:
    data = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def encoder_config(
    name: str,
    *,
    task: str,
    backend: str,
    width: int,
    max_batch_size: int = 8,
    token_types: bool = True,
    id_type: str = "TYPE_INT64",
    model_dir: Path | None = None,
) -> str:
    """config.pbtxt of an ids-in encoder export: input_ids, attention_mask (and token_type_ids) of
    [batch, tokens]; out last_hidden_state [batch, tokens, hidden] (embed) or logits [batch,
    labels] (score)."""
    head = {
        "onnxruntime": 'platform: "onnxruntime_onnx"',
        "tensorrt": 'platform: "tensorrt_plan"',
        "python": 'backend: "python"',
    }[backend]
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_types else [])
    lines = [f'name: "{name}"', head, f"max_batch_size: {max_batch_size}", "input ["]
    lines.append(",\n".join(f'  {{ name: "{i}" data_type: {id_type} dims: [ -1 ] }}' for i in inputs))
    lines.append("]")
    if task == "embed":
        lines.append(f'output [ {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {width} ] }} ]')
    else:
        lines.append(f'output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {width} ] }} ]')
    lines.append("dynamic_batching { }")
    lines.append(
        "instance_group [ { count: 1 kind: KIND_CPU } ]"
        if backend == "python"
        else "instance_group [ { count: 1 } ]"
    )
    if backend == "python":
        role = "hidden_states" if task == "embed" else "classifier"
        lines.append(_parameters({"role": role, "model_dir": str(model_dir)}))
    return "\n".join(lines) + "\n"


def text_encoder_config(name: str, *, width: int, model_dir: Path, max_batch_size: int = 8) -> str:
    """config.pbtxt of a text-in Python embedding model: text_input BYTES -> embedding FP32 [dim]."""
    return (
        "\n".join(
            [
                f'name: "{name}"',
                'backend: "python"',
                f"max_batch_size: {max_batch_size}",
                'input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]',
                f'output [ {{ name: "embedding" data_type: TYPE_FP32 dims: [ {width} ] }} ]',
                "dynamic_batching { }",
                "instance_group [ { count: 1 kind: KIND_CPU } ]",
                _parameters({"role": "text_embedding", "model_dir": str(model_dir)}),
            ]
        )
        + "\n"
    )


def _parameters(values: dict[str, str]) -> str:
    return (
        "parameters [\n"
        + ",\n".join(
            f'  {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}' for k, v in values.items()
        )
        + "\n]"
    )


def render_encoder_repository(
    out: Path,
    model_dir: Path,
    *,
    task: str,
    name: str,
    backend: str = "python",
    text_model: str | None = None,
    max_batch_size: int = 8,
) -> dict[str, Path]:
    """Write the encoder's model directory (and, with `text_model`, the text-in Python model) into
    the repository `out`; every config is parsed as Triton would. Returns the model directories."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}")
    config = _hf_config(model_dir)
    hidden = int(config.get("hidden_size", 0) or 0)  # type: ignore[call-overload]
    labels = config.get("id2label")
    width = hidden if task == "embed" else (len(labels) if isinstance(labels, dict) and labels else 1)
    token_types = int(config.get("type_vocab_size", 0) or 0) > 0  # type: ignore[call-overload]
    written: dict[str, Path] = {}
    texts = {
        name: encoder_config(
            name,
            task=task,
            backend=backend,
            width=width,
            max_batch_size=max_batch_size,
            token_types=token_types,
            model_dir=model_dir,
        )
    }
    if text_model is not None:
        texts[text_model] = text_encoder_config(
            text_model, width=width, model_dir=model_dir, max_batch_size=max_batch_size
        )
    for model, text in texts.items():
        parse_model_config(text, source=f"{model}/config.pbtxt")
        directory = out / model
        (directory / "1").mkdir(parents=True, exist_ok=True)
        (directory / "config.pbtxt").write_text(text, encoding="utf-8")
        if 'backend: "python"' in text:
            shutil.copyfile(TEMPLATE, directory / "1" / "model.py")
        written[model] = directory
    return written


def main(argv: Sequence[str] | None = None) -> int:
    from gateway.core.pooling import detect_task

    parser = argparse.ArgumentParser(prog="python -m deploy.encoder_repo", description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True, help="the model's Hugging Face directory")
    parser.add_argument("--out", type=Path, required=True, help="the repository to write into")
    parser.add_argument("--backend", choices=BACKENDS, default="onnxruntime")
    parser.add_argument("--task", choices=("embed", "score"), default=None, help="default: from --model-dir")
    parser.add_argument("--name", default=None, help="the Triton model name (default: embedding or reranker)")
    parser.add_argument("--text-model", default=None, help="also a text-in Python model of this name")
    parser.add_argument("--max-batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    task = args.task or detect_task(args.model_dir)
    if task == "generate":
        parser.error(
            f"{args.model_dir} is neither a sentence-transformers model nor a cross-encoder; give --task"
        )
    name = args.name or ("embedding" if task == "embed" else "reranker")
    written = render_encoder_repository(
        args.out,
        args.model_dir,
        task=task,
        name=name,
        backend=args.backend,
        text_model=args.text_model,
        max_batch_size=args.max_batch_size,
    )
    for model, directory in written.items():
        file = MODEL_FILES[args.backend] if model == name else "model.py"
        sys.stdout.write(
            f"{model}: {directory}"
            + (f" (put the exported {file} in {directory / '1'})\n" if file != "model.py" else "\n")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
