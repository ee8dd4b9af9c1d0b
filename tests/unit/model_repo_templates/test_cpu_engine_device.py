"""The reference engine's device mode: the refusal without CUDA, batched device sampling, and the
device decode path (run here on the CPU) giving what the CPU path gives."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.model_repo_templates.test_cpu_engine_guided import engine

torch = pytest.importorskip("torch")


def test_cuda_is_refused_in_one_line_when_torch_sees_no_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(engine.EngineError) as info:
        engine.check_engine_device("cuda", "bfloat16")
    message = str(info.value)
    assert message.startswith("engine_device=cuda but torch ")
    assert "sees no CUDA GPU" in message and "use engine_device=cpu" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("device", "dtype", "needle"),
    [
        ("tpu", "float32", "engine_device must be one of cpu, cuda, got 'tpu'"),
        ("cpu", "int8", "engine_dtype must be one of float32, bfloat16, float16, got 'int8'"),
    ],
)
def test_unknown_devices_and_dtypes_are_refused(device: str, dtype: str, needle: str) -> None:
    with pytest.raises(engine.EngineError, match=needle):
        engine.check_engine_device(device, dtype)


def test_the_cpu_in_float32_is_accepted() -> None:
    engine.check_engine_device("cpu", "float32")


def _params(**kwargs: Any) -> Any:
    return engine.SamplingParams(max_new_tokens=8, **kwargs)


def _logits(rows: int, vocab: int, seed: int = 0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((rows, vocab), generator=generator) * 3


def test_greedy_rows_take_the_argmax_with_its_log_softmax() -> None:
    logits = _logits(5, 50)
    tokens, log_probs = engine.sample_on_device(logits, [4, 0, 2], [_params(temperature=0.0)] * 3, [1, 2, 3])

    expected = torch.argmax(logits, dim=-1)
    assert tokens == [int(expected[4]), int(expected[0]), int(expected[2])]
    reference = torch.log_softmax(logits, dim=-1)
    for row, token, log_prob in zip([4, 0, 2], tokens, log_probs, strict=True):
        assert log_prob == pytest.approx(float(reference[row, token]), abs=1e-5)


def test_sampled_rows_are_reproducible_per_key_and_independent_of_the_batch() -> None:
    logits = _logits(4, 64)
    sampled = _params(temperature=1.0, top_p=1.0)
    alone = engine.sample_on_device(logits, [2], [sampled], [99])
    batched = engine.sample_on_device(
        logits, [0, 2, 3], [_params(temperature=0.0), sampled, sampled], [7, 99, 5]
    )

    assert batched[0][1] == alone[0][0]
    assert batched[1][1] == pytest.approx(alone[1][0])
    draws = {engine.sample_on_device(logits, [2], [sampled], [key])[0][0] for key in range(40)}
    assert len(draws) > 3  # different keys draw different tokens


def test_sampling_follows_the_softmax_of_the_scores_over_the_temperature() -> None:
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    sampled = _params(temperature=2.0, top_p=1.0)
    counts = np.zeros(4)
    for key in range(4000):
        token = engine.sample_on_device(scores, [0], [sampled], [engine.sequence_noise_key(3, 0, key)])[0][0]
        counts[token] += 1
    expected = torch.softmax(scores[0] / 2.0, dim=-1).numpy()
    assert np.allclose(counts / counts.sum(), expected, atol=0.03)
    token = engine.sample_on_device(scores, [0], [sampled], [1])[0][0]
    log_prob = engine.sample_on_device(scores, [0], [sampled], [1])[1][0]
    assert log_prob == pytest.approx(float(torch.log_softmax(scores[0] / 2.0, dim=-1)[token]), abs=1e-6)


@pytest.mark.parametrize(
    ("knobs", "allowed"),
    [
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.5}, {0}),  # token 0 alone holds more than half the mass
        ({"top_k": 3, "top_p": 0.9}, {0, 1, 2}),
    ],
)
def test_top_k_and_top_p_truncate_as_the_host_sampler_does(knobs: dict[str, Any], allowed: set[int]) -> None:
    scores = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    params = _params(temperature=1.0, **knobs)
    drawn = {engine.sample_on_device(scores, [0], [params], [key])[0][0] for key in range(300)}
    assert drawn == allowed or drawn < allowed
    assert 0 in drawn


class _Collect:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.log_probs: list[float] = []
        self.done = threading.Event()
        self.error: str | None = None

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        if tensors is not None:
            self.tokens.extend(int(t) for t in tensors["output_ids"].reshape(-1))
            self.log_probs.extend(float(x) for x in tensors["output_log_probs"].reshape(-1))
        if error is not None:
            self.error = error
        if final:
            self.done.set()


PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17]]
DECLARED = frozenset({"output_ids", "sequence_length", "output_log_probs", "cum_log_probs"})


def _run(runner: Any, params: list[Any]) -> list[_Collect]:
    loop = engine.Engine(runner=runner, kv_cache=None)
    sinks = [_Collect() for _ in PROMPTS]
    loop.start()
    try:
        for prompt, param, sink in zip(PROMPTS, params, sinks, strict=True):
            loop.submit(
                engine.RequestGroup(
                    prompts=[prompt],
                    params=[param],
                    options=engine.OutputOptions(streaming=True, return_log_probs=True),
                    sink=sink,
                    declared_outputs=DECLARED,
                )
            )
        for sink in sinks:
            assert sink.done.wait(60)
            assert sink.error is None
    finally:
        loop.shutdown()
    return sinks


def test_the_device_decode_path_gives_the_cpu_paths_greedy_tokens(tiny_bpe_dir: Path) -> None:
    """decode_batch's mask and positions built as on a GPU, and the batched sampler, here on the CPU:
    the same tokens and log probs as the CPU path (penalised rows take the host fallback)."""
    params = [
        _params(temperature=0.0),
        _params(repetition_penalty=1.3),
        _params(),
        _params(temperature=0.0, bad_words=((7,),)),
    ]
    reference = _run(engine.TransformersRunner(str(tiny_bpe_dir), 1), params)
    device_path = engine.TransformersRunner(str(tiny_bpe_dir), 1)
    device_path.on_cpu = False
    got = _run(device_path, params)
    for ref, out in zip(reference, got, strict=True):
        assert out.tokens == ref.tokens
        assert all(
            math.isclose(a, b, abs_tol=1e-4) for a, b in zip(out.log_probs, ref.log_probs, strict=True)
        )


def test_seeded_sampling_on_the_device_path_is_reproducible(tiny_bpe_dir: Path) -> None:
    runner = engine.TransformersRunner(str(tiny_bpe_dir), 1)
    runner.on_cpu = False
    params = [_params(temperature=1.0, top_k=50, seed=s) for s in (1, 2, 1, 3)]
    first = _run(runner, params)
    second = _run(runner, params)
    assert [s.tokens for s in first] == [s.tokens for s in second]
    # Requests with the same seed and prompt draw alike; prompts 0 and 2 differ, so only lengths match.
    assert all(len(s.tokens) == 8 for s in first)


class _Context:
    def __init__(self) -> None:
        self.context: dict[int, np.ndarray] = {}
        self.tokens: dict[int, list[int]] = {}
        self.done = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        assert error is None
        if tensors is not None:
            index = int(tensors["sequence_index"].reshape(-1)[0])
            if "context_logits" in tensors:
                self.context[index] = tensors["context_logits"]
            self.tokens.setdefault(index, []).extend(int(t) for t in tensors["output_ids"].reshape(-1))
        if final:
            self.done.set()


def test_batched_prefill_gives_each_prompt_its_own_context_logits_and_sequences(tiny_bpe_dir: Path) -> None:
    """Prompts of different lengths prefilled together (left-padded) on the device path: the same
    context logits as one prompt alone on the CPU path, and num_return_sequences rows continuing."""

    def run(on_cpu: bool) -> list[_Context]:
        runner = engine.TransformersRunner(str(tiny_bpe_dir), 1)
        runner.on_cpu = on_cpu
        loop = engine.Engine(runner=runner)
        sinks = [_Context() for _ in PROMPTS]
        declared = frozenset({"output_ids", "sequence_length", "context_logits", "sequence_index"})
        for prompt, sink in zip(PROMPTS, sinks, strict=True):
            loop.submit(
                engine.RequestGroup(
                    prompts=[prompt],
                    params=[_params(temperature=0.0)],
                    options=engine.OutputOptions(streaming=True, return_context_logits=True),
                    sink=sink,
                    declared_outputs=declared,
                    num_return_sequences=2,
                )
            )
        loop.start()  # every request is waiting: the first step admits them together
        try:
            for sink in sinks:
                assert sink.done.wait(60)
        finally:
            loop.shutdown()
        return sinks

    reference, batched = run(True), run(False)
    for prompt, ref, got in zip(PROMPTS, reference, batched, strict=True):
        assert got.context[0].shape == ref.context[0].shape == (1, len(prompt), ref.context[0].shape[-1])
        assert np.allclose(got.context[0], ref.context[0], atol=1e-4)
        assert got.tokens == ref.tokens and len(got.tokens[1]) == 8
