"""The gateway's CPU per streamed token at few against many streams per worker, this checkout's
code beside another checkout's, in paired rounds (issue 22: a worker carrying 8 streams paid about
twice the CPU per token of one carrying 64 on the 16-core host).

One gateway worker each, engine route, streaming over HTTP generate_stream; the real CPU Triton
with the synthetic engine (5 ms steps, 64-token outputs) serves the contract over gRPC, and with
`--fake` the token streams come from `loadtest.fake_triton_http` (the same events, written a step
at a time for every open stream), so the CPU Triton does not take the cores the measurement needs
on a small machine. In every round each concurrency is measured on both gateways seconds apart,
the order alternating; per cell: the gateway's CPU per token (user and system, from /proc), its
voluntary context switches per token (how often its event loop slept), tokens/s.

    git worktree add --detach ../base main
    python -m loadtest.lowload --base ../base --fake --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest import procstat
from loadtest.bench import BenchConfig, Stack, gateway_command, start_stack
from loadtest.openai_client import OpenAITarget
from loadtest.runner import LoadSpec, run_load
from loadtest.subproc import bench_setup, free_port, spawn_logged, stop_process, wait_http_ready
from loadtest.workload import Workload, synthetic_prompts

log = logging.getLogger("loadtest.lowload")


def _switches(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary_ctxt"))


def _spawn_gateway(
    stack: Stack, key: str, base: Path | None, workdir: Path
) -> tuple[int, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = gateway_command(port, stack, "engine", 1, (), "http")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    here = os.getcwd()
    if base is not None:
        # As bench_against does: the other checkout first on the path, this checkout's packages.
        env["PYTHONPATH"] = str(base)
        os.chdir(base)
    try:
        return port, spawn_logged(cmd, workdir / f"{key}.log", env)
    finally:
        os.chdir(here)


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`args.out` must exist; `args.base`, if given, is resolved."""
    out = Path(args.out)
    cfg = BenchConfig(step_ms=args.step_ms, max_tokens=args.max_tokens)
    workload = Workload(max_tokens=args.max_tokens, stream=True, ignore_eos=True, include_usage=True)
    rows: list[dict[str, Any]] = []
    keys = ["base", "branch"] if args.base else ["branch"]
    with start_stack(cfg, out) as real:
        stack = real
        fake: subprocess.Popen[bytes] | None = None
        if args.fake:
            port = free_port()
            fake = spawn_logged(
                [sys.executable, "-m", "loadtest.fake_triton_http", str(port), str(args.step_ms)],
                out / "fake_triton_http.log",
            )
            stack = replace(real, http_url=f"http://127.0.0.1:{port}")
        gateways: dict[str, tuple[subprocess.Popen[bytes], OpenAITarget]] = {}
        try:
            prompts = synthetic_prompts(1024, 32, seed=1, tokenizer_dir=stack.tokenizer_dir)
            for key in keys:
                port, proc = _spawn_gateway(stack, key, args.base if key == "base" else None, out)
                ready = f"http://127.0.0.1:{port}/health/ready"
                await asyncio.to_thread(wait_http_ready, proc, ready, 180.0, out / f"{key}.log")
                client = OpenAITarget(f"http://127.0.0.1:{port}/v1", stack.served_name, workload, name=key)
                await client.open(max(args.concurrency))
                gateways[key] = (proc, client)
            for r in range(args.rounds):
                for conc in args.concurrency:
                    for key in keys if r % 2 == 0 else keys[::-1]:
                        rows.append(await _measure(gateways[key], key, conc, r, args, prompts))
                        log.info("%s", json.dumps(rows[-1]))
        finally:
            for proc, client in gateways.values():
                await client.aclose()
                stop_process(proc)
            if fake is not None:
                stop_process(fake)
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    return rows


async def _measure(
    gateway: tuple[subprocess.Popen[bytes], OpenAITarget],
    key: str,
    conc: int,
    round_no: int,
    args: argparse.Namespace,
    prompts: Sequence[Any],
) -> dict[str, Any]:
    proc, client = gateway
    marks: dict[str, tuple[procstat.CpuSample, int]] = {}

    def on_window(phase: str) -> None:
        marks[phase] = (procstat.cpu_times(proc.pid), _switches(proc.pid))

    requests = conc * args.requests_per_stream
    spec = LoadSpec(concurrency=conc, requests=requests, duration_s=args.duration, warmup=min(8, requests))
    result = await run_load(
        client, prompts, spec, label=f"{key} c={conc}", progress=False, on_window=on_window
    )
    cpu = marks["end"][0] - marks["start"][0]
    tokens = max(result.summary.output_tokens, 1)
    return {
        "round": round_no,
        "gateway": key,
        "concurrency": conc,
        "tokens": result.summary.output_tokens,
        "errors": sum(result.summary.errors.values()),
        "tokens_per_s": round(result.summary.output_tokens_per_s, 1),
        "ms_per_token": cpu.total_s * 1e3 / tokens,
        "user_ms_per_token": cpu.user_s * 1e3 / tokens,
        "system_ms_per_token": cpu.system_s * 1e3 / tokens,
        "sleeps_per_token": (marks["end"][1] - marks["start"][1]) / tokens,
    }


def report(rows: Sequence[dict[str, Any]], concurrency: Sequence[int]) -> str:
    """Medians with their range, the low/high ratio per round, and branch/base per round."""

    def spread(values: Sequence[float], digits: int = 4) -> str:
        return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    keys = [k for k in ("base", "branch") if any(r["gateway"] == k for r in rows)]
    lines = [
        "| gateway | streams | rounds | CPU ms/token | user | system | loop sleeps/token | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        for conc in concurrency:
            cell = [r for r in rows if r["gateway"] == key and r["concurrency"] == conc]
            lines.append(
                f"| {key} | {conc} | {len(cell)} | {spread([r['ms_per_token'] for r in cell])} "
                f"| {statistics.median(r['user_ms_per_token'] for r in cell):.4f} "
                f"| {statistics.median(r['system_ms_per_token'] for r in cell):.4f} "
                f"| {statistics.median(r['sleeps_per_token'] for r in cell):.3f} "
                f"| {statistics.median(r['tokens_per_s'] for r in cell):.0f} |"
            )
    by = {(r["round"], r["gateway"], r["concurrency"]): r["ms_per_token"] for r in rows}
    rounds = sorted({r["round"] for r in rows})
    lines.append("")
    low, high = min(concurrency), max(concurrency)
    for key in keys:
        ratios = [
            by[(r, key, low)] / by[(r, key, high)]
            for r in rounds
            if (r, key, low) in by and (r, key, high) in by
        ]
        if ratios:
            lines.append(
                f"- {key}: CPU per token at {low} streams / at {high}, per round: {spread(ratios, 2)}"
            )
    if len(keys) == 2:
        for conc in concurrency:
            paired = [
                by[(r, "branch", conc)] / by[(r, "base", conc)] for r in rounds if (r, "base", conc) in by
            ]
            lines.append(f"- branch / base at {conc} streams, paired rounds: {spread(paired, 3)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.lowload", description=__doc__)
    p.add_argument("--base", help="another checkout to measure beside this one (e.g. a worktree of main)")
    p.add_argument("--fake", action="store_true", help="token streams from loadtest.fake_triton_http")
    p.add_argument("--concurrency", default="8,64", help="comma list of streams (one worker)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per cell")
    p.add_argument("--requests-per-stream", type=int, default=10)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", default="results/lowload")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.base = Path(args.base).resolve() if args.base else None
    Path(args.out).mkdir(parents=True, exist_ok=True)
    bench_setup()
    rows = asyncio.run(run(args))
    text = report(rows, args.concurrency)
    Path(args.out, "lowload.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
