"""What an encoder model's own files say about its output (pure, numpy only): how a
sentence-transformers model pools its token states and whether it normalizes (modules.json,
1_Pooling/config.json, a Normalize module), its Matryoshka dimensions, a cross-encoder's labels and
activation; and the task a model directory is for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gateway.config import ServedModel
from gateway.errors import ServerConfigError

Task = Literal["generate", "embed", "score"]
POOLING_MODES = ("cls", "mean", "max", "lasttoken", "mean_sqrt_len_tokens")
# sentence-transformers' legacy boolean keys, in the order it concatenates them.
_LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_lasttoken": "lasttoken",
}


def _json(path: Path) -> dict[str, Any] | list[Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict | list) else None


def _modules(model_dir: Path) -> list[dict[str, Any]]:
    data = _json(model_dir / "modules.json")
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def _kind(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rpartition(".")[2]


def model_task(model: ServedModel) -> Task:
    """What a served model does: as configured, or (auto) as its directory says."""
    return model.task if model.task != "auto" else detect_task(Path(model.tokenizer))


def detect_task(model_dir: Path) -> Task:
    """A sentence-transformers layout (modules.json with a Pooling module) embeds; a
    `*ForSequenceClassification` model scores; anything else generates."""
    if any(_kind(m) == "Pooling" for m in _modules(model_dir)):
        return "embed"
    config = _json(model_dir / "config.json")
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and any(
        isinstance(a, str) and a.endswith("ForSequenceClassification") for a in architectures
    ):
        return "score"
    return "generate"


@dataclass(frozen=True, slots=True)
class Pooling:
    """How per-token states become one embedding, as the model's sentence-transformers files say."""

    # Pooling modes, concatenated in this order (() where the files name none).
    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False
    # Modules after pooling the gateway does not apply (a Dense projection): a model that returns
    # per-token states cannot then be pooled in the gateway.
    unapplied: tuple[str, ...] = ()
    # Dimensions a request may truncate to (Matryoshka); `any_dimensions`: any up to the size.
    matryoshka: tuple[int, ...] = ()
    any_dimensions: bool = False
    max_length: int | None = None


def read_pooling(model_dir: Path) -> Pooling:
    modules = _modules(model_dir)
    modes: tuple[str, ...] = ("mean",)
    normalize = False
    unapplied: list[str] = []
    pooled = False
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = _kind(module)
        if kind == "Pooling":
            pooled = True
            config = _json(model_dir / str(module.get("path", "")) / "config.json")
            modes = _pooling_modes(config if isinstance(config, dict) else {})
        elif kind == "Normalize":
            normalize = True
        elif pooled and kind not in ("Transformer",):
            unapplied.append(kind)
    config = _json(model_dir / "config.json")
    config = config if isinstance(config, dict) else {}
    declared = config.get("matryoshka_dimensions")
    matryoshka = tuple(int(d) for d in declared) if isinstance(declared, list) else ()
    bert = _json(model_dir / "sentence_bert_config.json")
    max_length = bert.get("max_seq_length") if isinstance(bert, dict) else None
    return Pooling(
        modes=modes,
        normalize=normalize,
        unapplied=tuple(unapplied),
        matryoshka=matryoshka,
        any_dimensions=bool(config.get("is_matryoshka")),
        max_length=int(max_length) if isinstance(max_length, int) and max_length > 0 else None,
    )


def _pooling_modes(config: dict[str, Any]) -> tuple[str, ...]:
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        modes: tuple[str, ...] = (mode,)
    elif isinstance(mode, list):
        modes = tuple(str(m) for m in mode)
    else:
        modes = tuple(name for key, name in _LEGACY_MODES.items() if config.get(key))
        if config.get("pooling_mode_weightedmean_tokens"):
            modes += ("weightedmean",)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not modes:
        raise ServerConfigError(
            f"pooling mode {', '.join(unknown) or 'none'} is not one the gateway applies "
            f"({', '.join(POOLING_MODES)}); serve a model that returns its pooled embedding"
        )
    return modes


def pool(states: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """One input's [tokens, hidden] states (its own tokens only) -> its embedding, in float64."""
    states = states.astype(np.float64)
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(states[0])
        elif mode == "lasttoken":
            parts.append(states[-1])
        elif mode == "max":
            parts.append(states.max(axis=0))
        elif mode == "mean":
            parts.append(states.mean(axis=0))
        else:  # mean_sqrt_len_tokens
            parts.append(states.sum(axis=0) / np.sqrt(len(states)))
    return np.concatenate(parts)


def normalized(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    # As torch.nn.functional.normalize: a zero vector stays zero.
    return vector / max(norm, 1e-12)


@dataclass(frozen=True, slots=True)
class Classifier:
    """A cross-encoder's output: its labels, and the activation sentence-transformers applies."""

    num_labels: int = 1
    activation: Literal["sigmoid", "identity", "softmax"] = "sigmoid"


def read_classifier(model_dir: Path) -> Classifier:
    config = _json(model_dir / "config.json")
    config = config if isinstance(config, dict) else {}
    labels = config.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) and labels else int(config.get("num_labels", 1) or 1)
    st = config.get("sentence_transformers")
    named = str(st.get("activation_fn", "")) if isinstance(st, dict) else ""
    activation: Literal["sigmoid", "identity", "softmax"]
    if named.endswith("Identity"):
        activation = "identity"
    elif named.endswith("Sigmoid") or (not named and num_labels == 1):
        activation = "sigmoid"
    else:
        activation = "softmax" if num_labels > 1 else "sigmoid"
    return Classifier(num_labels=num_labels, activation=activation)


def relevance(logits: np.ndarray, classifier: Classifier, *, activate: bool) -> float:
    """A cross-encoder's score of one pair: its logit (the last label's, with several), through
    the model's activation unless the client asks for the raw logit."""
    values = logits.astype(np.float64).reshape(-1)
    if not activate or classifier.activation == "identity":
        return float(values[-1])
    if classifier.activation == "softmax" and len(values) > 1:
        exp = np.exp(values - values.max())
        return float(exp[-1] / exp.sum())
    return float(1.0 / (1.0 + np.exp(-values[-1])))
