"""Reading LoRA adapters: PEFT conversion in hf_lora_convert.py's layout, task ids, refusals, roots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from gateway.lora import (
    Adapter,
    AdapterError,
    AdapterStore,
    cast_weights,
    check_name,
    check_targets,
    config_columns,
    confined,
    convert_peft,
    parse_target_modules,
    read_adapter,
)

PREFIX = "base_model.model.model.layers"


def _peft(
    path: Path, *, rank: int = 2, alpha: float = 4, rslora: bool = False, seed: int = 0, **extra: object
) -> dict:
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in (0, 1):
        tensors[f"{PREFIX}.{layer}.self_attn.q_proj.lora_A.weight"] = rng.standard_normal((rank, 8)).astype(
            np.float32
        )
        tensors[f"{PREFIX}.{layer}.self_attn.q_proj.lora_B.weight"] = rng.standard_normal((8, rank)).astype(
            np.float32
        )
        tensors[f"{PREFIX}.{layer}.mlp.up_proj.lora_A.weight"] = rng.standard_normal((rank, 8)).astype(
            np.float32
        )
        tensors[f"{PREFIX}.{layer}.mlp.up_proj.lora_B.weight"] = rng.standard_normal((12, rank)).astype(
            np.float32
        )
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "use_rslora": rslora, **extra}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return tensors


@pytest.mark.parametrize(("rslora", "scale"), [(False, 4 / 2), (True, 4 / math.sqrt(2))])
def test_peft_conversion_is_hf_lora_converts_layout(tmp_path: Path, rslora: bool, scale: float) -> None:
    tensors = _peft(tmp_path, rslora=rslora)
    weights, config = convert_peft(tmp_path)
    # One row per (layer, module): attn_q is module 1, up_proj is mlp_gate (7) as the converter maps it.
    assert config.tolist() == [[1, 0, 2], [7, 0, 2], [1, 1, 2], [7, 1, 2]]
    assert weights.dtype == np.float16 and weights.shape == (4, 2 * 8 + 12 * 2)
    a = tensors[f"{PREFIX}.1.mlp.up_proj.lora_A.weight"]
    b = tensors[f"{PREFIX}.1.mlp.up_proj.lora_B.weight"]
    expected = np.concatenate([a.reshape(-1), (b * scale).reshape(-1)]).astype(np.float16)
    np.testing.assert_array_equal(weights[3], expected)
    # The narrower rows are zero-padded to the widest.
    assert not weights[0, 2 * 8 + 8 * 2 :].any()


def test_converted_npy_and_peft_dir_read_alike_with_a_stable_content_id(tmp_path: Path) -> None:
    _peft(tmp_path / "peft")
    weights, config = convert_peft(tmp_path / "peft")
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "model.lora_weights.npy", weights[None])
    np.save(tmp_path / "npy" / "model.lora_config.npy", config[None])
    peft, npy = read_adapter(tmp_path / "peft"), read_adapter(tmp_path / "npy")
    assert peft.task_id == npy.task_id == read_adapter(tmp_path / "peft").task_id
    np.testing.assert_array_equal(peft.weights, npy.weights)
    _peft(tmp_path / "other", seed=1)
    assert read_adapter(tmp_path / "other").task_id != peft.task_id
    assert 0 < peft.task_id < 2**63


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda p: (p / "adapter_model.safetensors").write_bytes(b"garbage"), "not a readable safetensors"),
        (lambda p: (p / "adapter_config.json").write_text("{"), "not readable JSON"),
        (lambda p: (p / "adapter_config.json").write_text('{"r": 2, "use_dora": true}'), "DoRA"),
        (lambda p: (p / "adapter_config.json").write_text('{"peft_type": "IA3", "r": 2}'), "not LoRA"),
        (lambda p: (p / "adapter_config.json").write_text('{"lora_alpha": 2}'), "integer `r`"),
        (lambda p: (p / "adapter_model.safetensors").unlink(), "no such file"),
        (lambda p: (p / "adapter_config.json").unlink(), "not a LoRA adapter"),
    ],
)
def test_a_damaged_adapter_is_refused_with_its_reason(tmp_path: Path, damage: object, needle: str) -> None:
    _peft(tmp_path)
    damage(tmp_path)  # type: ignore[operator]
    with pytest.raises(AdapterError, match=needle):
        read_adapter(tmp_path)


def test_converted_files_are_checked_and_never_unpickled(tmp_path: Path) -> None:
    np.save(tmp_path / "model.lora_weights.npy", np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "model.lora_config.npy", np.zeros((1, 1, 3), dtype=np.int32))
    with pytest.raises(AdapterError, match=r"not a readable \.npy"):
        read_adapter(tmp_path)
    np.save(tmp_path / "model.lora_weights.npy", np.ones((1, 1, 4), dtype=np.float16))
    np.save(tmp_path / "model.lora_config.npy", np.array([[[42, 0, 1]]], dtype=np.int32))
    with pytest.raises(AdapterError, match="is not a module, layer and rank"):
        read_adapter(tmp_path)


def test_modules_outside_the_engines_targets_are_refused(tmp_path: Path) -> None:
    _peft(tmp_path)
    tensors = read_adapter(tmp_path)
    check_targets("a", tensors, parse_target_modules("attn_q,mlp_gate"))
    check_targets("a", tensors, None)
    with pytest.raises(AdapterError, match="adapts mlp_gate, which the engine's lora_target_modules"):
        check_targets("a", tensors, parse_target_modules('["attn_q", "attn_v"]'))


@pytest.mark.parametrize("name", ["../x", "a/b", "a:b", ".hidden", "", "x" * 129, "a b", "a\\b"])
def test_adapter_names_with_path_characters_are_refused(name: str) -> None:
    with pytest.raises(AdapterError, match="is not allowed"):
        check_name(name)


def test_names_of_letters_digits_dots_dashes_pass() -> None:
    assert check_name("my-adapter_v1.2") == "my-adapter_v1.2"


def test_dynamic_paths_stay_inside_the_roots(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    _peft(root / "good")
    _peft(outside / "bad")
    (root / "escape").symlink_to(outside / "bad")
    (root / "links").mkdir()
    for file in (outside / "bad").iterdir():
        (root / "links" / file.name).symlink_to(file)
    assert confined(str(root / "good"), [root]) == (root / "good").resolve()
    for text, needle in (
        (str(outside / "bad"), "not inside"),
        (str(root / "escape"), "not inside"),
        (str(root / "links"), "links outside"),
        (f"{root}/good/../../outside/bad", "without '..'"),
        ("good", "absolute"),
        (str(root / "missing"), "does not exist"),
        (str(root), "not inside"),
    ):
        with pytest.raises(AdapterError, match=needle):
            confined(text, [root])


def test_the_store_keeps_within_its_bound_and_reads_again(tmp_path: Path) -> None:
    loads: list[str] = []
    paths = []
    for i in range(3):
        _peft(tmp_path / f"a{i}", seed=i)
        paths.append(tmp_path / f"a{i}")
    one = read_adapter(paths[0])
    size = one.weights.nbytes + one.config.nbytes
    store = AdapterStore(2 * size, on_load=lambda a: loads.append(a.name))
    adapters = [Adapter(f"a{i}", "base", p) for i, p in enumerate(paths)]
    ids = [store.get(a).task_id for a in adapters]
    assert store.loaded_bytes <= 2 * size
    assert store.get(adapters[0]).task_id == ids[0]
    assert loads == ["a0", "a1", "a2", "a0"]
    store.get(adapters[0])
    assert loads == ["a0", "a1", "a2", "a0"]


def test_weights_as_the_model_declares_them() -> None:
    weights = np.array([[1.0, -2.5, 3.140625]], dtype=np.float16)
    raw, dtype = cast_weights(weights, "BF16")
    assert dtype == "BF16"
    back = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(back, weights.astype(np.float32).reshape(-1))
    assert cast_weights(weights, "FP16") == (weights.tobytes(), "FP16")
    config = np.array([[1, 0, 2]], dtype=np.int32)
    assert config_columns(config, 4).tolist() == [[1, 0, 2, 0]]
    assert config_columns(config_columns(config, 4), 3).tolist() == [[1, 0, 2]]
