"""`python -m loadtest.bench_engine`: the reference engine alone (no Triton, no gateway), tokens/s at
a few batch sizes, on the CPU or a GPU.

For each batch size B: B streaming requests submitted together (prompts of `--prompt-tokens`, greedy,
`--max-tokens` each), run through the engine's in-flight batching loop; reports the wall time, the
output tokens/s and the mean time of a decode step with B rows (the runner's batched forward plus
sampling, timed apart from the loop after the run). What the engine can feed Triton's Python backend,
before any per-response cost.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from deploy.model_repo import load_reference_engine


class _Sink:
    def __init__(self, done: threading.Semaphore) -> None:
        self.tokens = 0
        self._done = done

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        if error is not None:
            raise RuntimeError(error)
        if tensors is not None:
            self.tokens += int(tensors["output_ids"].size)
        if final:
            self._done.release()


def run_batch(
    engine: ModuleType, runner: Any, batch: int, prompt_tokens: int, max_tokens: int
) -> dict[str, float]:
    loop = engine.Engine(runner=runner, max_active=max(batch, 1))
    done = threading.Semaphore(0)
    sinks = [_Sink(done) for _ in range(batch)]
    vocab = runner.vocab_size
    start = time.perf_counter()
    loop.start()
    try:
        for i, sink in enumerate(sinks):
            prompt = [(17 + 31 * i + 7 * j) % (vocab - 300) + 256 for j in range(prompt_tokens)]
            loop.submit(
                engine.RequestGroup(
                    prompts=[prompt],
                    params=[engine.SamplingParams(max_new_tokens=max_tokens, temperature=0.0)],
                    options=engine.OutputOptions(streaming=True),
                    sink=sink,
                    declared_outputs=frozenset({"output_ids", "sequence_length"}),
                )
            )
        for _ in sinks:
            if not done.acquire(timeout=600):
                raise TimeoutError("the engine did not finish")
        wall = time.perf_counter() - start
    finally:
        loop.shutdown()
    tokens = sum(s.tokens for s in sinks)
    return {"batch": batch, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall}


def decode_step_ms(engine: ModuleType, runner: Any, batch: int, prompt_tokens: int, steps: int = 20) -> float:
    """Mean time of one decode step of `batch` rows: the batched forward and the device sampler."""
    uids = list(range(10_000, 10_000 + batch))
    _, _, kv = runner.prefill(list(range(256, 256 + prompt_tokens)), False)
    runner.add(uids, kv)
    params = [engine.SamplingParams(max_new_tokens=steps, temperature=0.0)] * batch
    feed = dict.fromkeys(uids, 300)
    try:
        for _ in range(3):
            runner.decode_batch(feed)
        start = time.perf_counter()
        for step in range(steps):
            logits = runner.decode_batch(feed)
            tokens, _ = engine.sample_on_device(logits, range(batch), params, [step] * batch)
            feed = dict(zip(uids, tokens, strict=True))
        return (time.perf_counter() - start) * 1000 / steps
    finally:
        runner.remove(uids)


def torch_gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name(0))


def launch_overhead(kernels: int = 2000) -> str:
    """What one small CUDA kernel costs from Python (launch and dispatch, a sync at the end), and
    the environment that changes it: an eager forward of the model launches several hundred."""
    import os

    import torch

    x = torch.zeros(16, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(kernels):
        x.add_(1)
    torch.cuda.synchronize()
    per_kernel_us = (time.perf_counter() - start) * 1e6 / kernels
    blocking = os.environ.get("CUDA_LAUNCH_BLOCKING", "unset")
    return f"small kernel from Python: {per_kernel_us:.1f} us each (CUDA_LAUNCH_BLOCKING={blocking})"


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_engine", description=__doc__)
    p.add_argument("--model-dir", type=Path, help="default: build the tiny model of --kind")
    p.add_argument("--kind", default="gpu", help="tiny model kind when --model-dir is not given")
    p.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="auto", help="auto: float32 on cpu, bfloat16 on cuda")
    p.add_argument("--batches", default="1,16,64,256")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args(argv)
    from deploy import tiny_model

    model_dir = args.model_dir or tiny_model.build_tiny_model(args.kind)
    dtype = args.dtype if args.dtype != "auto" else ("float32" if args.device == "cpu" else "bfloat16")
    engine = load_reference_engine()
    runner = engine.TransformersRunner(str(model_dir), 1, device=args.device, dtype=dtype)
    name = args.device
    if args.device == "cuda":
        name = torch_gpu_name()
        sys.stdout.write(launch_overhead() + "\n")
    params = tiny_model.parameter_count(Path(model_dir))
    sys.stdout.write(f"reference engine on {name}, {params / 1e6:.1f}M parameters, {dtype}\n")
    sys.stdout.write(
        "| batch | output tokens | wall s | tokens/s | decode step ms (batch rows) |\n|---|---|---|---|---|\n"
    )
    run_batch(engine, runner, 2, args.prompt_tokens, 4)  # warm-up
    for batch in (int(b) for b in args.batches.split(",")):
        result = run_batch(engine, runner, batch, args.prompt_tokens, args.max_tokens)
        step = decode_step_ms(engine, runner, batch, args.prompt_tokens)
        sys.stdout.write(
            f"| {batch} | {result['tokens']:.0f} | {result['wall_s']:.2f} | {result['tokens_per_s']:.0f} | "
            f"{step:.2f} |\n"
        )
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
