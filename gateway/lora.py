"""LoRA adapters served as models: reading them (TensorRT-LLM's converted `.npy` pair or a Hugging Face
PEFT directory, converted here to the backend's tensors), their content-derived task ids, and a
bounded in-memory store. numpy and safetensors' numpy API only: the gateway never imports torch.

The backend's tensors (TensorRT-LLM's `hf_lora_convert.py` layout): `lora_weights` `[N, W]`, one row
per (module, layer): A `[r, in]` flattened, then B `[out, r]` flattened with the adapter's scaling
(alpha / r, or alpha / sqrt(r) with rsLoRA) folded in, zero-padded to the widest row; `lora_config`
`[N, 3]` rows `[module_id, layer_idx, r]`.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.engine import LoraTensors as AdapterTensors

logger = logging.getLogger(__name__)

# TensorRT-LLM's LoraManager.LORA_MODULE_IDS (the ids the engine's lora_target_modules name).
MODULE_IDS: dict[str, int] = {
    "attn_qkv": 0,
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
}
MODULE_NAMES: dict[int, str] = {v: k for k, v in MODULE_IDS.items()}
# Hugging Face module -> TensorRT-LLM module, as hf_lora_convert.py maps them (Llama-style models;
# gate_proj is mlp_h_to_4h and up_proj mlp_gate there).
HF_MODULES: dict[str, str] = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "qkv_proj": "attn_qkv",
    "query_key_value": "attn_qkv",
    "o_proj": "attn_dense",
    "dense": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "down_proj": "mlp_4h_to_h",
    "up_proj": "mlp_gate",
    "gate_up_proj": "mlp_h_to_4h",
    "c_fc": "mlp_h_to_4h",
    "c_proj": "mlp_4h_to_h",
}
WEIGHTS_FILE = "model.lora_weights.npy"
CONFIG_FILE = "model.lora_config.npy"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
# An adapter's name is a model name and may become a path component on the Triton side: no
# separators, no dots first, nothing a URL or a file system would read specially.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_PEFT_KEY = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:self_attn|attention|mlp)\.([A-Za-z_]+)\.lora_([AB])\.weight$"
)


class AdapterError(ValueError):
    """An adapter that cannot be read or converted; the message says which and why."""


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise AdapterError(
            f"adapter name {name!r} is not allowed: letters, digits, '.', '_' and '-' only "
            "(at most 128, starting with a letter or digit)"
        )
    return name


def nbytes(tensors: AdapterTensors) -> int:
    return int(tensors.weights.nbytes + tensors.config.nbytes)


def module_ids(tensors: AdapterTensors) -> frozenset[int]:
    return frozenset(int(m) for m in tensors.config[:, 0])


def task_id(weights: np.ndarray, config: np.ndarray) -> int:
    """A task id from the adapter's content: the same weights give the same id in every gateway
    process and replica (so a restart reuses what the backend cached), different weights a
    different one (an id the backend has cached is never sent with other weights). 63 bits: some
    clients and backends read the UINT64 as signed."""
    digest = hashlib.sha256()
    for array in (
        np.ascontiguousarray(config, dtype=np.int32),
        np.ascontiguousarray(weights, dtype=np.float16),
    ):
        digest.update(str(array.shape).encode())
        digest.update(array.tobytes())
    return int.from_bytes(digest.digest()[:8], "little") & (2**63 - 1) or 1


def read_adapter(path: Path) -> AdapterTensors:
    """Read an adapter directory (or raise AdapterError saying what is wrong with it)."""
    if (path / WEIGHTS_FILE).is_file() and (path / CONFIG_FILE).is_file():
        weights, config = _read_converted(path)
    elif (path / PEFT_CONFIG).is_file():
        weights, config = convert_peft(path)
    else:
        raise AdapterError(
            f"{path}: not a LoRA adapter (expected {WEIGHTS_FILE} + {CONFIG_FILE}, or a PEFT "
            f"directory with {PEFT_CONFIG} + {PEFT_WEIGHTS})"
        )
    _check_rows(path, weights, config)
    return AdapterTensors(task_id(weights, config), weights, config)


def _load_npy(file: Path) -> np.ndarray:
    try:
        # allow_pickle=False: an adapter file must never run code.
        return np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise AdapterError(f"{file}: not a readable .npy array ({exc})") from None


def _read_converted(path: Path) -> tuple[np.ndarray, np.ndarray]:
    weights = _load_npy(path / WEIGHTS_FILE)
    config = _load_npy(path / CONFIG_FILE)
    # The converter writes a leading batch dimension of 1.
    if weights.ndim == 3 and weights.shape[0] == 1:
        weights = weights[0]
    if config.ndim == 3 and config.shape[0] == 1:
        config = config[0]
    if weights.ndim != 2 or config.ndim != 2 or config.shape[1] not in (3, 4):
        raise AdapterError(
            f"{path}: lora_weights must be [1, N, W] and lora_config [1, N, 3 or 4], got "
            f"{list(weights.shape)} and {list(config.shape)}"
        )
    if not np.issubdtype(weights.dtype, np.floating) or not np.issubdtype(config.dtype, np.integer):
        raise AdapterError(f"{path}: lora_weights must be floating point and lora_config integers")
    return weights.astype(np.float16), config.astype(np.int32)


def _check_rows(path: Path, weights: np.ndarray, config: np.ndarray) -> None:
    if weights.shape[0] != config.shape[0] or not config.shape[0]:
        raise AdapterError(
            f"{path}: lora_weights and lora_config must have the same (non-zero) number of rows"
        )
    if not np.all(np.isfinite(weights.astype(np.float32))):
        raise AdapterError(f"{path}: lora_weights holds values that are not finite (too large for float16?)")
    for module, layer, rank in config[:, :3].tolist():
        if module not in MODULE_NAMES or layer < 0 or rank <= 0:
            raise AdapterError(
                f"{path}: lora_config row [{module}, {layer}, {rank}] is not a module, layer and rank"
            )
    if config.shape[1] == 4 and np.any(config[:, 3]):
        raise AdapterError(f"{path}: DoRA adapters are not supported")


def convert_peft(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A PEFT LoRA directory as the backend's tensors, converted as `hf_lora_convert.py` does."""
    try:
        settings = json.loads((path / PEFT_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterError(f"{path / PEFT_CONFIG}: not readable JSON ({exc})") from None
    if not isinstance(settings, dict):
        raise AdapterError(f"{path / PEFT_CONFIG}: expected a JSON object")
    if str(settings.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{path}: a {settings.get('peft_type')} adapter, not LoRA")
    if settings.get("use_dora"):
        raise AdapterError(f"{path}: DoRA adapters are not supported")
    try:
        rank = int(settings["r"])
        alpha = float(settings.get("lora_alpha", rank))
    except (KeyError, TypeError, ValueError):
        raise AdapterError(f"{path / PEFT_CONFIG}: needs an integer `r` and a number `lora_alpha`") from None
    if rank <= 0:
        raise AdapterError(f"{path / PEFT_CONFIG}: r must be positive")
    scale = alpha / math.sqrt(rank) if settings.get("use_rslora") else alpha / rank
    tensors = _read_safetensors(path / PEFT_WEIGHTS)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = collections.defaultdict(dict)
    for key, value in tensors.items():
        match = _PEFT_KEY.search(key)
        if match is None:
            if "lora_" in key:
                raise AdapterError(f"{path}: adapter weight {key!r} is on a module the backend cannot adapt")
            continue
        layer, module, side = int(match.group(1)), match.group(2), match.group(3)
        if module not in HF_MODULES:
            raise AdapterError(f"{path}: module {module!r} has no TensorRT-LLM LoRA module")
        pairs[(layer, module)][side] = value
    if not pairs:
        raise AdapterError(f"{path / PEFT_WEIGHTS}: no LoRA weights of decoder layers found")
    rows: list[np.ndarray] = []
    config: list[list[int]] = []
    for (layer, module), sides in sorted(
        pairs.items(), key=lambda item: (item[0][0], HF_MODULES[item[0][1]])
    ):
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"{path}: layer {layer} {module} has lora_{''.join(sides)} without its pair")
        a, b = sides["A"].astype(np.float32), sides["B"].astype(np.float32)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(
                f"{path}: layer {layer} {module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} "
                "do not pair"
            )
        if module == "gate_up_proj":
            # The fused projection's halves are in the other order in TensorRT-LLM.
            half = b.shape[0] // 2
            b = np.concatenate([b[half:], b[:half]])
        rows.append(np.concatenate([a.reshape(-1), (b * scale).reshape(-1)]))
        config.append([MODULE_IDS[HF_MODULES[module]], layer, a.shape[0]])
    width = max(r.size for r in rows)
    weights = np.zeros((len(rows), width), dtype=np.float16)
    for i, row in enumerate(rows):
        weights[i, : row.size] = row.astype(np.float16)
    return weights, np.array(config, dtype=np.int32)


def _read_safetensors(file: Path) -> dict[str, np.ndarray]:
    if not file.is_file():
        raise AdapterError(f"{file}: no such file (PEFT weights as safetensors are needed)")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        raise AdapterError(f"{file}: not a readable safetensors file ({exc})") from None


def check_targets(name: str, tensors: AdapterTensors, targets: Iterable[int] | None) -> None:
    """Refuse an adapter that adapts a module the engine was not built for (`lora_target_modules`)."""
    if targets is None:
        return
    missing = module_ids(tensors) - set(targets)
    if missing:
        names = ", ".join(MODULE_NAMES[m] for m in sorted(missing))
        raise AdapterError(
            f"adapter {name!r} adapts {names}, which the engine's lora_target_modules does not include"
        )


@dataclass(frozen=True, slots=True)
class Adapter:
    """One adapter as clients name it: where its files are, here and (for the llmapi model) on the
    Triton server."""

    name: str
    base: str
    path: Path
    server_path: str | None = None


class AdapterStore:
    """Adapters' tensors, read on first use and kept within a byte budget (least recently used
    dropped first, read again when next needed: the task id stays the same for the same files)."""

    def __init__(self, max_bytes: int, on_load: Callable[[Adapter], None] | None = None) -> None:
        self._max_bytes = max_bytes
        self._loaded: collections.OrderedDict[str, tuple[Adapter, AdapterTensors]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._on_load = on_load

    def get(self, adapter: Adapter) -> AdapterTensors:
        """Blocking (file reads): call it from a worker thread."""
        with self._lock:
            found = self._loaded.get(adapter.name)
            if found is not None and found[0] == adapter:
                self._loaded.move_to_end(adapter.name)
                return found[1]
        tensors = read_adapter(adapter.path)
        if self._on_load is not None:
            self._on_load(adapter)
        logger.info(
            "LoRA adapter %s: read %s (task id %d, %d rows, %.1f MiB)",
            adapter.name,
            adapter.path,
            tensors.task_id,
            tensors.config.shape[0],
            nbytes(tensors) / 2**20,
        )
        with self._lock:
            self._drop(adapter.name)
            self._loaded[adapter.name] = (adapter, tensors)
            self._bytes += nbytes(tensors)
            while self._bytes > self._max_bytes and len(self._loaded) > 1:
                self._drop(next(iter(self._loaded)))
        return tensors

    def forget(self, name: str) -> None:
        with self._lock:
            self._drop(name)

    def _drop(self, name: str) -> None:
        found = self._loaded.pop(name, None)
        if found is not None:
            self._bytes -= nbytes(found[1])

    @property
    def loaded_bytes(self) -> int:
        return self._bytes


def cast_weights(weights: np.ndarray, triton_dtype: str) -> tuple[bytes, str]:
    """The weights as the model declares `lora_weights`: FP16 (TensorRT-LLM's), BF16 or FP32."""
    if triton_dtype == "FP32":
        return weights.astype(np.float32).tobytes(), "FP32"
    if triton_dtype == "BF16":
        # bfloat16 is float32's upper half, rounded to nearest even.
        bits = weights.astype(np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16).tobytes(), "BF16"
    return weights.astype(np.float16).tobytes(), "FP16"


def config_columns(config: np.ndarray, width: int) -> np.ndarray:
    """`lora_config` with the number of columns the model declares (3, or 4 with `is_dora`)."""
    if width == config.shape[1]:
        return config
    if width == 4:
        return np.concatenate([config, np.zeros((config.shape[0], 1), dtype=np.int32)], axis=1)
    return np.ascontiguousarray(config[:, :3])


def parse_target_modules(text: str) -> tuple[int, ...] | None:
    """`lora_target_modules` as an engine declares it (names, comma or JSON list) -> module ids."""
    text = text.strip()
    if not text:
        return None
    try:
        names: Any = json.loads(text) if text.startswith("[") else text.split(",")
    except ValueError:
        return None
    ids = [MODULE_IDS.get(str(n).strip()) for n in names]
    return tuple(i for i in ids if i is not None) or None


def confined(path_text: str, roots: Iterable[Path]) -> Path:
    """An adapter directory named at run time, refused (AdapterError) unless it and the adapter
    files in it are inside one of `roots` once every symbolic link is followed; no `..` either."""
    path = Path(path_text)
    if not path_text or not path.is_absolute() or ".." in path.parts:
        raise AdapterError(f"lora_path must be an absolute path without '..', not {path_text!r}")
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise AdapterError(f"lora_path {path_text!r} does not exist") from None
    for root in roots:
        top = root.resolve()
        if real == top or not real.is_relative_to(top):
            continue
        for name in (WEIGHTS_FILE, CONFIG_FILE, PEFT_CONFIG, PEFT_WEIGHTS):
            file = real / name
            if file.exists() and not file.resolve().is_relative_to(top):
                raise AdapterError(f"lora_path {path_text!r}: {name} links outside the adapter roots")
        if not real.is_dir():
            raise AdapterError(f"lora_path {path_text!r} is not a directory")
        return real
    raise AdapterError(f"lora_path {path_text!r} is not inside the adapter roots the gateway allows")
