"""Priority under overload: one open-loop stream of requests through the gateway, each high or low
priority (the `priority` body field), arriving faster than the gateway's admission limit lets them
run; time to first token and 429s (shed) per class.

Targets (issue 20): high-priority TTFT p50 at least 3x lower than low-priority, and no high-priority
request shed while low-priority ones are admitted.

`run_priority(base_url, model, prompts, cfg)` drives any running gateway (`make bench-routing`
calls it against its own stack); `python -m loadtest.priority` starts the CPU Triton with the
synthetic engine and a gateway whose admission limit is tight enough to overload, runs the
scenario, prints the table and writes `results/priority-<timestamp>/`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadtest.metrics import RequestRecord
from loadtest.openai_client import OpenAITarget
from loadtest.stats import percentile
from loadtest.workload import Endpoint, Prompt, Workload, cycle, synthetic_prompts

log = logging.getLogger(__name__)

# What the gateway answers a request its admission refused (queue full, displaced, timed out).
SHED = "http_429"


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    rate: float = 40.0  # arrivals per second, both classes together (open loop, Poisson)
    duration_s: float = 20.0
    high_share: float = 0.25  # fraction of arrivals that are high priority
    high_priority: int = -10  # vLLM's convention: lower is more urgent
    low_priority: int = 10
    max_tokens: int = 32
    prompt_tokens: int = 32
    endpoint: Endpoint = "chat"
    seed: int = 0
    # The gateway's admission limit: what `python -m loadtest.priority` starts it with.
    max_concurrent: int = 4
    max_queued: int = 32
    queue_timeout_s: float = 10.0
    step_ms: float = 5.0  # the synthetic engine's step (one token per request per step)


@dataclass(frozen=True, slots=True)
class ClassStats:
    name: str
    priority: int
    sent: int
    ok: int
    shed: int
    errors: dict[str, int]
    ttft_p50_ms: float
    ttft_p99_ms: float
    # High priority only: shed while a low-priority request already waiting was admitted after it.
    shed_while_other_admitted: int = 0


@dataclass(frozen=True, slots=True)
class PriorityResult:
    config: PriorityConfig
    high: ClassStats
    low: ClassStats
    elapsed_s: float
    records: dict[str, tuple[RequestRecord, ...]] = field(default_factory=dict)

    @property
    def ttft_ratio(self) -> float:
        """Low-priority TTFT p50 over high-priority TTFT p50 (target: at least 3)."""
        if not self.high.ttft_p50_ms or self.high.ttft_p50_ms != self.high.ttft_p50_ms:
            return float("nan")
        return self.low.ttft_p50_ms / self.high.ttft_p50_ms

    def checks(self) -> list[tuple[bool, str]]:
        ratio = self.ttft_ratio
        return [
            (
                ratio >= 3.0,
                f"high-priority TTFT p50 {self.high.ttft_p50_ms:.1f} ms vs low "
                f"{self.low.ttft_p50_ms:.1f} ms: {ratio:.1f}x lower (target >= 3x)",
            ),
            (
                self.low.shed > 0,
                f"overloaded: {self.low.shed} of {self.low.sent} low-priority requests shed (429)",
            ),
            (
                self.high.shed_while_other_admitted == 0,
                f"high-priority requests shed while a waiting low-priority one was admitted after them: "
                f"{self.high.shed_while_other_admitted} (target 0; {self.high.shed} high shed in all, "
                f"{self.low.ok} low admitted)",
            ),
        ]


# A low-priority request whose first token came this long after a high-priority request was shed
# was admitted after it (and not merely already running then, its first token still in flight).
INVERSION_SLACK_S = 0.05


def inversions(shed_high: Sequence[RequestRecord], low: Sequence[RequestRecord]) -> int:
    """High-priority requests shed while a low-priority one that had already arrived was admitted
    after them: the priority inversions the admission queue must never make."""
    admitted = [(r.start, r.chunk_times[0]) for r in low if r.ok and r.chunk_times]
    count = 0
    for r in shed_high:
        refused_at = r.end
        if any(start <= refused_at < first - INVERSION_SLACK_S for start, first in admitted):
            count += 1
    return count


def _class_stats(name: str, priority: int, records: Sequence[RequestRecord], inverted: int = 0) -> ClassStats:
    ttfts = sorted(r.ttft * 1000 for r in records if r.ok and r.ttft is not None)
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None and r.error != SHED:
            errors[r.error] = errors.get(r.error, 0) + 1
    return ClassStats(
        name=name,
        priority=priority,
        sent=len(records),
        ok=sum(1 for r in records if r.ok),
        shed=sum(1 for r in records if r.error == SHED),
        errors=errors,
        ttft_p50_ms=percentile(ttfts, 50, presorted=True),
        ttft_p99_ms=percentile(ttfts, 99, presorted=True),
        shed_while_other_admitted=inverted,
    )


async def run_priority(
    base_url: str, model: str, prompts: Sequence[Prompt], cfg: PriorityConfig, *, api_key: str | None = None
) -> PriorityResult:
    """Drive a running gateway (`base_url` ends in /v1) with the two-class overload."""
    if not prompts:
        raise ValueError("no prompts")
    targets = {}
    for name, priority in (("high", cfg.high_priority), ("low", cfg.low_priority)):
        workload = Workload(
            max_tokens=cfg.max_tokens,
            ignore_eos=True,
            endpoint=cfg.endpoint,
            extra_body={"priority": priority},
        )
        targets[name] = OpenAITarget(base_url, model, workload, api_key=api_key, name=f"priority-{name}")
    expected = int(cfg.rate * cfg.duration_s * 1.5) + 16
    for target in targets.values():
        await target.open(expected)
    rng = random.Random(cfg.seed)
    records: dict[str, list[RequestRecord]] = {"high": [], "low": []}
    tasks: set[asyncio.Task[None]] = set()

    async def one(name: str, i: int) -> None:
        records[name].append(await targets[name].send(cycle(prompts, i)))

    start = time.perf_counter()
    deadline = start + cfg.duration_s
    next_at = start
    i = 0
    try:
        while True:
            # Arrivals on an absolute clock, so a slow iteration does not lower the rate.
            next_at += rng.expovariate(cfg.rate)
            if next_at >= deadline:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            name = "high" if rng.random() < cfg.high_share else "low"
            task = asyncio.create_task(one(name, i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        for target in targets.values():
            await target.aclose()
    elapsed = time.perf_counter() - start
    shed_high = [r for r in records["high"] if r.error == SHED]
    high = _class_stats("high", cfg.high_priority, records["high"], inversions(shed_high, records["low"]))
    low = _class_stats("low", cfg.low_priority, records["low"])
    return PriorityResult(cfg, high, low, elapsed, records={k: tuple(v) for k, v in records.items()})


def markdown(result: PriorityResult) -> str:
    cfg = result.config
    lines = [
        f"Priority under overload: {cfg.rate:g} requests/s for {cfg.duration_s:g} s "
        f"({cfg.high_share:.0%} high priority), {cfg.max_tokens} output tokens each, "
        f"gateway admission {cfg.max_concurrent} running + {cfg.max_queued} queued "
        f"(timeout {cfg.queue_timeout_s:g} s).",
        "",
        "| class | priority | sent | ok | shed (429) | other errors | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in (result.high, result.low):
        other = ", ".join(f"{k}={v}" for k, v in sorted(s.errors.items())) or "0"
        lines.append(
            f"| {s.name} | {s.priority} | {s.sent} | {s.ok} | {s.shed} | {other} | "
            f"{s.ttft_p50_ms:.1f} | {s.ttft_p99_ms:.1f} |"
        )
    lines.append("")
    lines += [f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in result.checks()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ standalone run


async def _standalone(cfg: PriorityConfig, workdir: Path) -> PriorityResult:
    from deploy import devstack
    from loadtest.bench import Stack, _child_env, gateway_command
    from loadtest.subproc import free_port, spawn_logged, stop_process, wait_http_ready

    repo = devstack.prepare_dev_repository(
        workdir / "model_repo",
        engine_mode="synthetic",
        variables={"synthetic_step_ms": cfg.step_ms, "max_active_requests": 1024},
    )
    with devstack.TritonServer([repo.path], log_file=workdir / "tritonserver.log") as server:
        stack = Stack(
            grpc_url=server.grpc_url,
            http_url=server.http_url,
            tokenizer_dir=str(repo.model_dir),
            triton_pid=server.pid,
            ensemble=repo.ensemble,
        )
        port = free_port()
        extra = [
            "--max-concurrent-requests",
            str(cfg.max_concurrent),
            "--max-queued-requests",
            str(cfg.max_queued),
            "--queue-timeout-s",
            str(cfg.queue_timeout_s),
            "--no-access-log",
        ]
        log_path = workdir / "gateway.log"
        proc = spawn_logged(gateway_command(port, stack, "engine", 1, extra), log_path, _child_env())
        try:
            await asyncio.to_thread(
                wait_http_ready, proc, f"http://127.0.0.1:{port}/health/ready", 180.0, log_path
            )
            prompts = synthetic_prompts(
                256, cfg.prompt_tokens, seed=cfg.seed, tokenizer_dir=stack.tokenizer_dir
            )
            return await run_priority(f"http://127.0.0.1:{port}/v1", stack.served_name, prompts, cfg)
        finally:
            stop_process(proc)


def build_parser() -> argparse.ArgumentParser:
    d = PriorityConfig()
    p = argparse.ArgumentParser(
        prog="python -m loadtest.priority",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rate", type=float, default=d.rate, help="arrivals per second, both classes")
    p.add_argument("--duration", type=float, default=d.duration_s, help="seconds of arrivals")
    p.add_argument("--high-share", type=float, default=d.high_share, help="fraction of high priority")
    p.add_argument("--high-priority", type=int, default=d.high_priority)
    p.add_argument("--low-priority", type=int, default=d.low_priority)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    p.add_argument("--endpoint", choices=("chat", "completions", "responses"), default=d.endpoint)
    p.add_argument("--max-concurrent", type=int, default=d.max_concurrent, help="gateway admission")
    p.add_argument("--max-queued", type=int, default=d.max_queued, help="gateway admission queue")
    p.add_argument("--queue-timeout", type=float, default=d.queue_timeout_s)
    p.add_argument("--step-ms", type=float, default=d.step_ms, help="synthetic engine step")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default="", help="results directory (default results/priority-<time>)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = PriorityConfig(
        rate=args.rate,
        duration_s=args.duration,
        high_share=args.high_share,
        high_priority=args.high_priority,
        low_priority=args.low_priority,
        max_tokens=args.max_tokens,
        prompt_tokens=args.prompt_tokens,
        endpoint=args.endpoint,
        seed=args.seed,
        max_concurrent=args.max_concurrent,
        max_queued=args.max_queued,
        queue_timeout_s=args.queue_timeout,
        step_ms=args.step_ms,
    )
    out = Path(args.out or f"results/priority-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="priority-") as tmp:
        result = asyncio.run(_standalone(cfg, Path(tmp)))
    text = markdown(result)
    (out / "priority.md").write_text(text)
    data: dict[str, Any] = {
        "config": asdict(cfg),
        "high": asdict(result.high),
        "low": asdict(result.low),
        "elapsed_s": result.elapsed_s,
        "ttft_ratio": result.ttft_ratio,
        "checks": [{"ok": ok, "text": t} for ok, t in result.checks()],
    }
    (out / "priority.json").write_text(json.dumps(data, indent=2))
    print(text)
    print(f"written to {out}/")
    return 0 if all(ok for ok, _ in result.checks()) else 1


if __name__ == "__main__":
    sys.exit(main())
