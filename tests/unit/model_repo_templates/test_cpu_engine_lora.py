"""The CPU engine's LoRA: per-row low-rank updates equal to transformers + PEFT, and TensorRT-LLM's
cache rules and words."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy import model_repo
from gateway.lora import read_adapter
from tests.support.lora import make_peft_adapter, reference_greedy

engine = model_repo.load_reference_engine()
MODULES = "attn_q,attn_k,attn_v,attn_dense,mlp_h_to_4h,mlp_4h_to_h,mlp_gate"
DECLARED = frozenset({"output_ids", "sequence_length"})


class _Collect:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.done = threading.Event()
        self.error: str | None = None
        self.hold = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        if tensors is not None:
            self.tokens.extend(int(t) for t in tensors["output_ids"].reshape(-1))
        if error is not None:
            self.error = error
        if final:
            self.done.set()


@pytest.fixture(scope="module")
def adapters(tiny_bpe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "plain": make_peft_adapter(tiny_bpe_dir, root / "plain", 1),
        # rsLoRA: alpha / sqrt(r) = 8 / 2.
        "rslora": make_peft_adapter(tiny_bpe_dir, root / "rslora", 2, rank=4, alpha=8, use_rslora=True),
        "attention": make_peft_adapter(tiny_bpe_dir, root / "attention", 3, modules=("q_proj", "v_proj")),
    }


def _lora(path: Path, *, weights: bool = True) -> Any:
    tensors = read_adapter(path)
    if not weights:
        return engine.LoraInput(tensors.task_id)
    return engine.LoraInput(tensors.task_id, tensors.weights[None], tensors.config[None])


def _group(prompt: list[int], sink: _Collect, lora: Any, max_tokens: int = 12) -> Any:
    return engine.RequestGroup(
        prompts=[prompt],
        params=[engine.SamplingParams(max_new_tokens=max_tokens, temperature=0.0)],
        options=engine.OutputOptions(streaming=True, exclude_input=True),
        sink=sink,
        declared_outputs=DECLARED,
        lora=lora,
    )


def _engine(model_dir: Path, capacity: int = 4) -> Any:
    runner = engine.TransformersRunner(str(model_dir), 1)
    runner.enable_lora(engine.parse_lora_target_modules(MODULES))
    cache = engine.LoraCache(capacity, runner.lora_shapes, runner.lora_tensor)
    return engine.Engine(runner=runner, kv_cache=None, lora_cache=cache)


def test_mixed_adapters_in_one_batch_equal_transformers_and_peft(
    tiny_bpe_dir: Path, adapters: dict[str, Path]
) -> None:
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [17, 18], [19, 20, 21]]
    which = [None, "plain", "rslora", "attention", "plain"]
    loop = _engine(tiny_bpe_dir)
    sinks = [_Collect() for _ in prompts]
    loop.start()
    try:
        for prompt, name, sink in zip(prompts, which, sinks, strict=True):
            loop.submit(_group(prompt, sink, None if name is None else _lora(adapters[name])))
        for sink in sinks:
            assert sink.done.wait(120)
            assert sink.error is None
    finally:
        loop.shutdown()
    assert loop.lora_cache.loads == 3
    outputs = {}
    for prompt, name, sink in zip(prompts, which, sinks, strict=True):
        expected = reference_greedy(tiny_bpe_dir, None if name is None else adapters[name], prompt, 12)
        assert sink.tokens == expected, name
        outputs[name] = sink.tokens
    # The adapters do change the text (else this test could not fail).
    assert len({tuple(t) for t in outputs.values()}) == 4


def test_cache_rules_and_words_are_tensorrt_llms(tiny_bpe_dir: Path, adapters: dict[str, Path]) -> None:
    cache = _engine(tiny_bpe_dir, capacity=2).lora_cache
    plain, rslora, attention = (_lora(adapters[n]) for n in ("plain", "rslora", "attention"))
    with pytest.raises(engine.EngineError) as missing:
        cache.acquire(_lora(adapters["plain"], weights=False))
    assert str(missing.value) == (
        f"LoRA task {plain.task_id} not found in cache. Please send LoRA weights with request"
    )
    first = cache.acquire(plain)
    # Weights sent again under a cached id are ignored: the cached adapter is used.
    other = engine.LoraInput(plain.task_id, rslora.weights, rslora.config)
    assert cache.acquire(other) is first
    second = cache.acquire(rslora)
    with pytest.raises(engine.EngineError, match=r"^Cache is full\. There are no done tasks to evict$"):
        cache.acquire(attention)
    cache.release(first)
    cache.release(first)
    # The least recently used adapter no request is using makes room.
    cache.acquire(attention)
    assert cache.evictions == 1
    assert cache.acquire(_lora(adapters["rslora"], weights=False)) is second
    with pytest.raises(engine.EngineError, match="not found in cache"):
        cache.acquire(_lora(adapters["plain"], weights=False))


def test_submit_wraps_a_cache_error_as_the_executor_does(
    tiny_bpe_dir: Path, adapters: dict[str, Path]
) -> None:
    loop = _engine(tiny_bpe_dir)
    with pytest.raises(engine.EngineError) as error:
        loop.submit(_group([5, 6], _Collect(), _lora(adapters["plain"], weights=False)))
    assert str(error.value).startswith(
        "Executor failed process requestId 1 due to the following error: LoRA task "
    )


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (np.array([[[9, 0, 8]]], dtype=np.int32), "not in this engine's lora_target_modules"),
        (np.array([[[1, 7, 8]]], dtype=np.int32), "not in this engine's lora_target_modules"),
        (np.array([[[1, 0, 999]]], dtype=np.int32), "does not fit a row"),
        (np.array([[[1, 0, 8, 1]]], dtype=np.int32), "DoRA"),
    ],
)
def test_malformed_lora_config_is_an_error_not_a_crash(
    tiny_bpe_dir: Path, rows: np.ndarray, needle: str
) -> None:
    cache = _engine(tiny_bpe_dir).lora_cache
    weights = np.zeros((1, 1, 8 * 128), dtype=np.float16)
    with pytest.raises(engine.EngineError, match=needle):
        cache.acquire(engine.LoraInput(7, weights, rows))


def test_an_adapter_loaded_by_path_gives_the_same_tokens(
    tiny_bpe_dir: Path, adapters: dict[str, Path]
) -> None:
    """How the llmapi stand-in loads `lora_path`: the PEFT directory read by the engine itself."""
    loop = _engine(tiny_bpe_dir)
    sink = _Collect()
    loop.start()
    try:
        loop.submit(_group([7, 8, 9], sink, engine.read_peft_adapter(str(adapters["rslora"]), 99)))
        assert sink.done.wait(120) and sink.error is None
    finally:
        loop.shutdown()
    assert sink.tokens == reference_greedy(tiny_bpe_dir, adapters["rslora"], [7, 8, 9], 12)
    with pytest.raises(engine.EngineError, match="cannot load the LoRA adapter"):
        engine.read_peft_adapter(str(tiny_bpe_dir / "missing"), 5)
