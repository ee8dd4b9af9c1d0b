"""`python -m loadtest.bench` (`make bench`): the gateway against direct Triton and against LiteLLM.

Starts the CPU Triton stack with the synthetic engine (deterministic tokens at a fixed step, no
model compute, so the clients are what is measured), then drives the same streaming workload at
each concurrency through every target:
  (a) direct Triton gRPC streaming from Python (the floor for any Python gateway),
  (b) the gateway over the ensemble (and over the engine route),
  (c) Triton's native HTTP generate_stream,
  (d) the LiteLLM proxy with its Triton provider.
For each: output tokens/s, TTFT p50/p99, errors, and the CPU the client-side process burned per
streamed token (/proc), with ratios against (a). Writes results/<timestamp>/ and prints the table.

The whole sweep runs `--repeat N` times (default 3) in rounds. A round starts every selected target,
then measures each concurrency on every target in turn, so the figures compared at a level are taken
seconds apart and a drift of the shared machine hits every target alike. Each table cell is the
median over the rounds; the per-round figures are kept in bench_rounds.csv/bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from loadtest import procstat
from loadtest.anthropic_client import AnthropicTarget
from loadtest.metrics import RequestRecord, RunSummary
from loadtest.openai_client import OpenAITarget
from loadtest.report import plot_sweep, request_rows, summary_dict, write_csv, write_json
from loadtest.runner import LoadSpec, run_load
from loadtest.stats import Distribution
from loadtest.subproc import (
    NotReady,
    bench_setup,
    free_port,
    serve_command,
    spawn_logged,
    split_args,
    stop_process,
    wait_http_ready,
)
from loadtest.target import Target
from loadtest.workload import Prompt, Workload, synthetic_prompts

log = logging.getLogger(__name__)

Kind = Literal["triton-grpc", "gateway", "triton-http", "litellm"]


@dataclass(frozen=True, slots=True)
class BenchTarget:
    key: str  # CLI name
    label: str  # table name
    kind: Kind
    route: str = "ensemble"  # gateway only
    # gateway only: which API the load goes to.
    endpoint: Literal["completions", "chat", "responses", "messages"] = "completions"
    # gateway only: how it streams from Triton ("http": generate_stream, as --triton-http-url sets up).
    transport: Literal["http", "grpc"] = "http"


# The order is the table's order; (a) runs first because every ratio is against it.
TARGETS: tuple[BenchTarget, ...] = (
    BenchTarget("grpc", "(a) Triton gRPC, Python client", "triton-grpc"),
    BenchTarget("gateway", "(b) gateway, ensemble route", "gateway", route="ensemble"),
    BenchTarget("gateway-engine", "(b) gateway, engine route", "gateway", route="engine"),
    # The gateway's previous transport (gRPC ModelStreamInfer for generation too), for comparison.
    BenchTarget("gateway-grpc", "(b) gateway, ensemble route, over gRPC", "gateway", transport="grpc"),
    BenchTarget("gateway-chat", "(b) gateway, ensemble route, chat completions", "gateway", endpoint="chat"),
    BenchTarget(
        "gateway-responses", "(b) gateway, ensemble route, Responses API", "gateway", endpoint="responses"
    ),
    BenchTarget(
        "gateway-messages", "(b) gateway, ensemble route, Messages API", "gateway", endpoint="messages"
    ),
    BenchTarget("triton-http", "(c) Triton HTTP generate_stream", "triton-http"),
    BenchTarget("litellm", "(d) LiteLLM proxy, Triton provider", "litellm"),
)
BASELINE = "grpc"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    concurrencies: tuple[int, ...] = (1, 16, 64, 256)
    targets: tuple[str, ...] = tuple(t.key for t in TARGETS)
    max_tokens: int = 64
    prompt_tokens: int = 32
    step_ms: float = 5.0  # synthetic engine step: one token per active request per step
    requests_per_stream: int = 3  # requests per level = max(min_requests, concurrency * this)
    min_requests: int = 24
    level_duration_s: float = 30.0  # no new requests after this, per level
    warmup: int = 8
    gateway_workers: int = 1
    gateway_extra_args: tuple[str, ...] = ()
    soak_streams: int = 0  # 0: no soak scenario
    soak_max_tokens: int = 200
    # Interleaved rounds of the whole sweep; the table reports the median of each cell over them.
    repeats: int = 3
    out_dir: str = ""
    # An already running Triton instead of starting the CPU stack: (grpc host:port, http URL, tokenizer dir).
    external: tuple[str, str, str] | None = None
    litellm_venv: str = ".cache/litellm-venv"

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(
            concurrencies=(1, 16),
            max_tokens=16,
            prompt_tokens=16,
            requests_per_stream=2,
            min_requests=8,
            level_duration_s=10.0,
            warmup=2,
            repeats=1,
        )


@dataclass(frozen=True, slots=True)
class LevelResult:
    target: str
    label: str
    concurrency: int
    summary: RunSummary
    client_cpu_s: float  # the measured client-side process tree, over the measured window
    loadgen_cpu_s: float  # this process (the load generator), same window
    triton_cpu_s: float
    measured: str  # what client_cpu_s covers
    round: int = 1  # 1-based round of the sweep

    @property
    def cpu_ms_per_token(self) -> float:
        tokens = self.summary.output_tokens
        return self.client_cpu_s * 1000.0 / tokens if tokens else math.nan

    @property
    def triton_cpu_ms_per_token(self) -> float:
        tokens = self.summary.output_tokens
        return self.triton_cpu_s * 1000.0 / tokens if tokens else math.nan


@dataclass(frozen=True, slots=True)
class TargetOutcome:
    target: BenchTarget
    levels: tuple[LevelResult, ...] = ()
    unavailable: str | None = None  # why the target could not run (in this round)
    records: dict[int, tuple[RequestRecord, ...]] = field(default_factory=dict)
    round: int = 1  # 1-based round of the sweep this outcome belongs to


@dataclass(frozen=True, slots=True)
class Stack:
    grpc_url: str  # host:port
    http_url: str  # http://host:port
    tokenizer_dir: str
    triton_pid: int | None
    ensemble: str = "ensemble"
    engine: str = "tensorrt_llm"
    served_name: str = "tiny"


@dataclass(frozen=True, slots=True)
class Running:
    """A started target: the client to drive it and the process whose CPU is charged to it."""

    client: Target
    pid: int
    include_children: bool
    measured: str


# --------------------------------------------------------------------------------------------- stack


@contextlib.contextmanager
def start_stack(cfg: BenchConfig, workdir: Path) -> Iterator[Stack]:
    """The real CPU tritonserver on a rendered repository with the synthetic engine (deploy.devstack)."""
    if cfg.external is not None:
        grpc_url, http_url, tokenizer_dir = cfg.external
        yield Stack(
            grpc_url=grpc_url,
            http_url=http_url,
            tokenizer_dir=tokenizer_dir,
            triton_pid=_pid_listening(grpc_url),
        )
        return
    from deploy import devstack

    repo = devstack.prepare_dev_repository(
        workdir / "model_repo",
        engine_mode="synthetic",
        # Enough active sequences for the soak's open streams; the step sets the per-stream token rate.
        variables={"synthetic_step_ms": cfg.step_ms, "max_active_requests": max(1024, cfg.soak_streams)},
    )
    with devstack.TritonServer(
        [repo.path],
        log_file=workdir / "tritonserver.log",
        # Where root: so that Triton's HTTP frontend keeps every stream response (devstack says why).
        http_send_buffer=devstack.TRITON_HTTP_SEND_BUFFER,
    ) as server:
        yield Stack(
            grpc_url=server.grpc_url,
            http_url=server.http_url,
            tokenizer_dir=str(repo.model_dir),
            triton_pid=server.pid,
            ensemble=repo.ensemble,
        )


def _pid_listening(hostport: str) -> int | None:
    """The pid of the local process listening on hostport's port, if this user can see it (for its CPU)."""
    port = int(hostport.rsplit(":", 1)[1])
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(cols[9])
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(proc.name)
    return None


def gateway_command(
    port: int, stack: Stack, route: str, workers: int, extra: Sequence[str], transport: str = "http"
) -> list[str]:
    """Exactly the documented `gateway serve` command line, plus workers and any extra flags."""
    spec = (
        f"name={stack.served_name},triton_model={stack.ensemble},"
        f"tokenizer={stack.tokenizer_dir},route={route}"
    )
    if route == "engine":
        spec += f",engine_model={stack.engine}"
    http_url = stack.http_url if transport == "http" else None
    return serve_command(port, stack.grpc_url, spec, http_url=http_url, workers=workers, extra=extra)


@contextlib.asynccontextmanager
async def start_target(
    target: BenchTarget, stack: Stack, cfg: BenchConfig, workload: Workload, workdir: Path
) -> AsyncIterator[Running]:
    max_conc = max(cfg.concurrencies)
    if target.kind == "triton-grpc":
        from loadtest.triton_grpc import TritonGrpcTarget

        client: Target = TritonGrpcTarget(stack.grpc_url, stack.ensemble, workload, name=target.key)
        await client.open(max_conc)
        try:
            # Here the client is the gateway-equivalent: this very process is what gets charged.
            yield Running(client, os.getpid(), False, "load-generator process (the gRPC client itself)")
        finally:
            await client.aclose()
        return
    if target.kind == "triton-http":
        from loadtest.triton_http import TritonHttpTarget

        client = TritonHttpTarget(stack.http_url, stack.ensemble, workload, name=target.key)
        await client.open(max_conc)
        try:
            # No client-side server process: Triton does the HTTP work; charge the load generator.
            yield Running(client, os.getpid(), False, "load-generator process (HTTP client)")
        finally:
            await client.aclose()
        return
    if target.kind == "gateway":
        port = free_port()
        log_path = workdir / f"{target.key}.log"
        cmd = gateway_command(
            port, stack, target.route, cfg.gateway_workers, cfg.gateway_extra_args, target.transport
        )
        proc = spawn_logged(cmd, log_path, _child_env())
        try:
            await asyncio.to_thread(
                wait_http_ready, proc, f"http://127.0.0.1:{port}/health/ready", 180.0, log_path
            )
            base = f"http://127.0.0.1:{port}"
            if target.endpoint == "messages":
                client = AnthropicTarget(base, stack.served_name, workload, name=target.key)
            else:
                openai_workload = replace(workload, endpoint=target.endpoint)
                client = OpenAITarget(base + "/v1", stack.served_name, openai_workload, name=target.key)
            await client.open(max_conc)
            try:
                yield Running(
                    client, proc.pid, True, f"gateway process tree ({cfg.gateway_workers} worker(s))"
                )
            finally:
                await client.aclose()
        finally:
            stop_process(proc)
        return
    if target.kind == "litellm":
        from loadtest import litellm_proxy

        exe = await asyncio.to_thread(litellm_proxy.ensure_venv, Path(cfg.litellm_venv))
        with litellm_proxy.run_proxy(
            exe=exe,
            workdir=workdir / "litellm",
            port=free_port(),
            triton_http_url=stack.http_url,
            triton_model=stack.ensemble,
            served_name=stack.served_name,
        ) as proxy:
            # The provider speaks chat only (it builds text_input from messages with a prompt template).
            chat = replace(workload, endpoint="chat")
            # trust_usage=False: LiteLLM's usage is its own tiktoken count of the text (128 for 64
            # engine tokens here), so the content chunks, one per engine token, are counted instead.
            client = OpenAITarget(
                proxy.base_url,
                stack.served_name,
                chat,
                api_key=proxy.api_key,
                name=target.key,
                trust_usage=False,
            )
            await client.open(max_conc)
            try:
                yield Running(client, proxy.pid, True, "LiteLLM proxy process tree")
            finally:
                await client.aclose()
        return
    raise ValueError(f"unknown target kind {target.kind}")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


# ----------------------------------------------------------------------------------------- measuring


async def measure_level(
    running: Running,
    target: BenchTarget,
    prompts: Sequence[Prompt],
    concurrency: int,
    cfg: BenchConfig,
    stack: Stack,
    round_no: int = 1,
) -> tuple[LevelResult, tuple[RequestRecord, ...]]:
    requests = max(cfg.min_requests, concurrency * cfg.requests_per_stream)
    spec = LoadSpec(
        concurrency=concurrency,
        requests=requests,
        duration_s=cfg.level_duration_s,
        warmup=min(cfg.warmup, requests),
    )
    marks: dict[str, tuple[procstat.CpuSample, procstat.CpuSample, procstat.CpuSample | None]] = {}
    me = os.getpid()

    def on_window(phase: str) -> None:
        marks[phase] = (
            procstat.cpu_times(running.pid, include_children=running.include_children),
            procstat.cpu_times(me, include_children=False),
            procstat.cpu_times(stack.triton_pid) if stack.triton_pid else None,
        )

    result = await run_load(
        running.client,
        prompts,
        spec,
        label=f"{target.key} c={concurrency} r={round_no}",
        progress=False,
        on_window=on_window,
    )
    (c0, l0, t0), (c1, l1, t1) = marks["start"], marks["end"]
    level = LevelResult(
        target=target.key,
        label=target.label,
        concurrency=concurrency,
        summary=result.summary,
        client_cpu_s=(c1 - c0).total_s,
        loadgen_cpu_s=(l1 - l0).total_s,
        triton_cpu_s=(t1 - t0).total_s if t0 is not None and t1 is not None else math.nan,
        measured=running.measured,
        round=round_no,
    )
    s = level.summary
    log.info(
        "r%d %-16s c=%-4d %6.0f tok/s  TTFT p50 %7.1f ms p99 %7.1f ms  errors %d  CPU %.3f ms/tok",
        round_no,
        target.key,
        concurrency,
        s.output_tokens_per_s,
        s.ttft.p50 * 1000,
        s.ttft.p99 * 1000,
        sum(s.errors.values()),
        level.cpu_ms_per_token,
    )
    return level, result.records


async def run_round(
    selected: Sequence[BenchTarget],
    stack: Stack,
    cfg: BenchConfig,
    workload: Workload,
    prompts: Sequence[Prompt],
    workdir: Path,
    round_no: int = 1,
) -> list[TargetOutcome]:
    """One round, level by level: every target is started first, then each concurrency is measured
    on every target in turn. The targets compared at a level are so measured seconds apart rather
    than minutes: this shared machine's speed drifts by tens of percent over minutes (the load
    generator's own CPU per token, for the same work, moved that much between rounds), which target
    by target ordering turned into differences between targets. Targets not being measured idle."""
    levels: dict[str, list[LevelResult]] = {t.key: [] for t in selected}
    records: dict[str, dict[int, tuple[RequestRecord, ...]]] = {t.key: {} for t in selected}
    failed: dict[str, str] = {}
    running: dict[str, Running] = {}

    def fail(target: BenchTarget, exc: Exception) -> None:
        # The report says why a target did not run; the others still do.
        failed[target.key] = f"{type(exc).__name__}: {exc}"
        log.error("%s unavailable in round %d: %s", target.key, round_no, failed[target.key])

    async with contextlib.AsyncExitStack() as started:
        for target in selected:
            log.info("round %d/%d: starting %s", round_no, cfg.repeats, target.label)
            try:
                running[target.key] = await started.enter_async_context(
                    start_target(target, stack, cfg, workload, workdir)
                )
            except Exception as exc:
                fail(target, exc)
        for c in cfg.concurrencies:
            for target in selected:
                if target.key in failed:
                    continue
                try:
                    level, recs = await measure_level(
                        running[target.key], target, prompts, c, cfg, stack, round_no
                    )
                except Exception as exc:
                    fail(target, exc)
                    continue
                levels[target.key].append(level)
                records[target.key][c] = recs
    return [
        TargetOutcome(
            t, tuple(levels[t.key]), unavailable=failed.get(t.key), records=records[t.key], round=round_no
        )
        for t in selected
    ]


# ------------------------------------------------------------------------------------------ reporting


def _ratio(x: float, base: float) -> float:
    return x / base if base and not math.isnan(base) and not math.isnan(x) else math.nan


def _f(x: float, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _finite(xs: Iterable[float]) -> list[float]:
    return [x for x in xs if not math.isnan(x)]


def _median(xs: Iterable[float]) -> float:
    """statistics.median (the mean of the middle two for an even count) of the non-NaN values; NaN if none.

    A round without a figure (no successful request: no TTFT; no Triton pid: no Triton CPU) does not
    drag the median: the median is over the rounds that have the figure.
    """
    vals = _finite(xs)
    return float(statistics.median(vals)) if vals else math.nan


def _min(xs: Iterable[float]) -> float:
    vals = _finite(xs)
    return min(vals) if vals else math.nan


def _max(xs: Iterable[float]) -> float:
    vals = _finite(xs)
    return max(vals) if vals else math.nan


def rounds_of(outcomes: Sequence[TargetOutcome]) -> int:
    """How many rounds the outcomes cover (every round has an outcome for every selected target)."""
    return len({o.round for o in outcomes})


def _median_distribution(dists: Sequence[Distribution]) -> Distribution:
    return Distribution(
        count=sum(d.count for d in dists),
        mean=_median(d.mean for d in dists),
        p50=_median(d.p50 for d in dists),
        p90=_median(d.p90 for d in dists),
        p99=_median(d.p99 for d in dists),
        min=_min(d.min for d in dists),
        max=_max(d.max for d in dists),
    )


def median_summary(summaries: Sequence[RunSummary]) -> RunSummary:
    """One level's rounds as one summary: counts summed, every rate and percentile the median of that
    figure over the rounds (so TTFT p99 is the median of the rounds' p99s, not the p99 of the pooled
    requests)."""
    first = summaries[0]
    errors: Counter[str] = Counter()
    for s in summaries:
        errors.update(s.errors)
    return RunSummary(
        label=first.label,
        mode=first.mode,
        load=first.load,
        duration_s=_median(s.duration_s for s in summaries),
        requests=sum(s.requests for s in summaries),
        successes=sum(s.successes for s in summaries),
        errors=dict(errors),
        output_tokens=sum(s.output_tokens for s in summaries),
        prompt_tokens=sum(s.prompt_tokens for s in summaries),
        output_tokens_per_s=_median(s.output_tokens_per_s for s in summaries),
        requests_per_s=_median(s.requests_per_s for s in summaries),
        ttft=_median_distribution([s.ttft for s in summaries]),
        itl=_median_distribution([s.itl for s in summaries]),
        tpot=_median_distribution([s.tpot for s in summaries]),
        e2e=_median_distribution([s.e2e for s in summaries]),
        tokens_per_request=_median_distribution([s.tokens_per_request for s in summaries]),
    )


def _loadgen_ms_per_token(lv: LevelResult) -> float:
    tokens = lv.summary.output_tokens
    return lv.loadgen_cpu_s * 1000 / tokens if tokens else math.nan


def _grouped(outcomes: Sequence[TargetOutcome]) -> dict[tuple[str, int], list[LevelResult]]:
    """Each (target, concurrency)'s levels over the rounds, in table order: targets as first seen,
    and within a target its concurrencies in the order they ran."""
    order = {key: i for i, key in enumerate(dict.fromkeys(o.target.key for o in outcomes))}
    groups: dict[tuple[str, int], list[LevelResult]] = {}
    for o in sorted(outcomes, key=lambda o: o.round):
        for lv in o.levels:
            groups.setdefault((lv.target, lv.concurrency), []).append(lv)
    return {k: groups[k] for k in sorted(groups, key=lambda k: order[k[0]])}


def comparison_rows(outcomes: Sequence[TargetOutcome]) -> list[dict[str, Any]]:
    """One row per (target, concurrency): the median of every figure over the rounds that ran it.

    Ratios and differences against (a) are taken between medians (each target's median first, then
    against (a)'s median at the same concurrency), not as medians of per-round ratios. Requests,
    successes and errors are summed over the rounds; min/max columns show the spread.
    """
    total = rounds_of(outcomes)
    rows: list[dict[str, Any]] = []
    for (key, conc), levels in _grouped(outcomes).items():
        s = median_summary([lv.summary for lv in levels])
        cpu = [lv.cpu_ms_per_token for lv in levels]
        tps = [lv.summary.output_tokens_per_s for lv in levels]
        rows.append(
            {
                "target": key,
                "label": levels[0].label,
                "concurrency": conc,
                "rounds": len(levels),
                "rounds_total": total,
                **_counts(s),
                "output_tokens_per_s_min": _min(tps),
                "output_tokens_per_s_max": _max(tps),
                "throughput_vs_a": math.nan,
                "ttft_p50_ms": s.ttft.p50 * 1000,
                "ttft_p99_ms": s.ttft.p99 * 1000,
                "ttft_p50_over_a_ms": math.nan,
                "tpot_p50_ms": s.tpot.p50 * 1000,
                "client_cpu_s": _median(lv.client_cpu_s for lv in levels),
                "client_cpu_ms_per_token": _median(cpu),
                "client_cpu_ms_per_token_min": _min(cpu),
                "client_cpu_ms_per_token_max": _max(cpu),
                "cpu_vs_a": math.nan,
                "loadgen_cpu_ms_per_token": _median(_loadgen_ms_per_token(lv) for lv in levels),
                "triton_cpu_ms_per_token": _median(lv.triton_cpu_ms_per_token for lv in levels),
                "measured": levels[0].measured,
            }
        )
    base = {r["concurrency"]: r for r in rows if r["target"] == BASELINE}
    for r in rows:
        b = base.get(r["concurrency"])
        if b is None:
            continue
        r["throughput_vs_a"] = _ratio(r["output_tokens_per_s"], b["output_tokens_per_s"])
        r["ttft_p50_over_a_ms"] = r["ttft_p50_ms"] - b["ttft_p50_ms"]
        r["cpu_vs_a"] = _ratio(r["client_cpu_ms_per_token"], b["client_cpu_ms_per_token"])
    return rows


def _counts(s: RunSummary) -> dict[str, Any]:
    """The request and token counts every row starts with."""
    return {
        "requests": s.requests,
        "successes": s.successes,
        "errors": sum(s.errors.values()),
        "error_kinds": ";".join(f"{k}={v}" for k, v in sorted(s.errors.items())),
        "output_tokens": s.output_tokens,
        "output_tokens_per_s": s.output_tokens_per_s,
    }


def round_rows(outcomes: Sequence[TargetOutcome]) -> list[dict[str, Any]]:
    """The raw figures: one row per (target, concurrency, round), ratios against (a) in the same round."""
    base = {(lv.round, lv.concurrency): lv for o in outcomes if o.target.key == BASELINE for lv in o.levels}
    rows: list[dict[str, Any]] = []
    for (_key, _conc), levels in _grouped(outcomes).items():
        for lv in levels:
            b = base.get((lv.round, lv.concurrency))
            s = lv.summary
            rows.append(
                {
                    "target": lv.target,
                    "label": lv.label,
                    "concurrency": lv.concurrency,
                    "round": lv.round,
                    **_counts(s),
                    "throughput_vs_a": _ratio(s.output_tokens_per_s, b.summary.output_tokens_per_s)
                    if b
                    else math.nan,
                    "ttft_p50_ms": s.ttft.p50 * 1000,
                    "ttft_p99_ms": s.ttft.p99 * 1000,
                    "ttft_p50_over_a_ms": (s.ttft.p50 - b.summary.ttft.p50) * 1000 if b else math.nan,
                    "tpot_p50_ms": s.tpot.p50 * 1000,
                    "client_cpu_s": lv.client_cpu_s,
                    "client_cpu_ms_per_token": lv.cpu_ms_per_token,
                    "cpu_vs_a": _ratio(lv.cpu_ms_per_token, b.cpu_ms_per_token) if b else math.nan,
                    "loadgen_cpu_ms_per_token": _loadgen_ms_per_token(lv),
                    "triton_cpu_ms_per_token": lv.triton_cpu_ms_per_token,
                    "measured": lv.measured,
                }
            )
    return rows


def _by_target(outcomes: Sequence[TargetOutcome]) -> dict[str, list[TargetOutcome]]:
    """Each target's outcomes (one per round it was tried in), in round order."""
    by: dict[str, list[TargetOutcome]] = {}
    for o in sorted(outcomes, key=lambda o: o.round):
        by.setdefault(o.target.key, []).append(o)
    return by


def unavailable_targets(outcomes: Sequence[TargetOutcome]) -> dict[str, list[TargetOutcome]]:
    """The targets that failed in every round they were tried in (key -> their failed outcomes)."""
    return {
        k: tried for k, tried in _by_target(outcomes).items() if all(o.unavailable is not None for o in tried)
    }


def _label(r: dict[str, Any]) -> str:
    if r.get("rounds", 1) < r.get("rounds_total", 1):
        return f"{r['label']} [{r['rounds']}/{r['rounds_total']} rounds]"
    return str(r["label"])


def markdown_table(rows: Sequence[dict[str, Any]], outcomes: Sequence[TargetOutcome]) -> str:
    head = (
        "| target | conc | ok/req | errors | out tok/s | vs (a) | TTFT p50 ms | TTFT p99 ms | "
        "TTFT p50 - (a) ms | client CPU ms/tok | vs (a) | Triton CPU ms/tok |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        errors = r["error_kinds"] or "0"
        lines.append(
            f"| {_label(r)} | {r['concurrency']} | {r['successes']}/{r['requests']} | {errors} | "
            f"{_f(r['output_tokens_per_s'], '.0f')} | {_f(r['throughput_vs_a'], '.2f')}x | "
            f"{_f(r['ttft_p50_ms'], '.1f')} | {_f(r['ttft_p99_ms'], '.1f')} | "
            f"{_f(r['ttft_p50_over_a_ms'], '+.1f')} | {_f(r['client_cpu_ms_per_token'], '.3f')} | "
            f"{_f(r['cpu_vs_a'], '.2f')}x | {_f(r['triton_cpu_ms_per_token'], '.3f')} |"
        )
    total = rounds_of(outcomes)
    for failed in unavailable_targets(outcomes).values():
        reasons = "; ".join(dict.fromkeys(o.unavailable or "" for o in failed)).replace("|", "/")
        every = f" (in all {total} rounds)" if total > 1 else ""
        lines.append(f"| {failed[0].target.label} | - | - | did not run{every}: {reasons} |" + " - |" * 8)
    return "\n".join(lines)


def round_notes(outcomes: Sequence[TargetOutcome]) -> list[str]:
    """The targets that failed in some rounds but not all: which rounds, why, and what the cells cover."""
    total = rounds_of(outcomes)
    gone = unavailable_targets(outcomes)
    out: list[str] = []
    for key, tried in _by_target(outcomes).items():
        failed = [o for o in tried if o.unavailable is not None]
        if not failed or key in gone:
            continue
        where = "; ".join(
            f"round {o.round} after {len(o.levels)} level(s): {o.unavailable}" for o in failed
        ).replace("|", "/")
        out.append(
            f"- {tried[0].target.label} failed in {len(failed)} of {total} rounds ({where}). It ran "
            f"completely in {len(tried) - len(failed)} of {total} rounds; its cells are medians over the "
            "rounds that measured them ([n/N rounds] in the table where fewer than all)."
        )
    return out


def spread_table(rows: Sequence[dict[str, Any]]) -> str:
    """Min-max over the rounds of the two figures that move most, with the range relative to the median."""

    def span(lo: float, hi: float, median: float, fmt: str) -> str:
        if math.isnan(lo) or math.isnan(hi):
            return "-"
        rel = f" ({(hi - lo) / median * 100:.0f}%)" if median and not math.isnan(median) else ""
        return f"{lo:{fmt}}-{hi:{fmt}}{rel}"

    lines = [
        "| target | conc | rounds | out tok/s min-max (range/median) "
        "| client CPU ms/tok min-max (range/median) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        tps = span(
            r["output_tokens_per_s_min"], r["output_tokens_per_s_max"], r["output_tokens_per_s"], ".0f"
        )
        cpu = span(
            r["client_cpu_ms_per_token_min"],
            r["client_cpu_ms_per_token_max"],
            r["client_cpu_ms_per_token"],
            ".3f",
        )
        lines.append(f"| {r['label']} | {r['concurrency']} | {r['rounds']} | {tps} | {cpu} |")
    return "\n".join(lines)


def rounds_line(n: int) -> str:
    """The report's header line on rounds and on what a cell is."""
    if n == 1:
        what = "each cell is that round's figure (the median over 1 round); `--repeat N` for medians over N"
    else:
        what = (
            f"each cell is the median over the {n} rounds (statistics.median: the mean of the middle two "
            "for an even count)"
        )
    return (
        f"Rounds: {n} (a round starts every target, then runs each concurrency on every target in turn, "
        "so the figures compared at a level are taken seconds apart; one Triton for all rounds); "
        f"{what}. The `vs (a)` and `- (a)` columns compare medians: each target's "
        "median first, then its ratio (or difference) to (a)'s median, not the median of per-round ratios. "
        "ok/req and errors are summed over the rounds. Per-round figures: bench_rounds.csv, bench.json."
    )


def target_checks(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The issue's targets, evaluated on this run's numbers (figures, not pass/fail tests)."""
    by = {(r["target"], r["concurrency"]): r for r in rows}
    out: list[str] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    for c in sorted({r["concurrency"] for r in rows}):
        chat, responses = by.get(("gateway-chat", c)), by.get(("gateway-responses", c))
        if chat and responses and chat["client_cpu_ms_per_token"]:
            ratio = responses["client_cpu_ms_per_token"] / chat["client_cpu_ms_per_token"]
            out.append(
                f"- gateway-responses vs gateway-chat at concurrency {c}: "
                f"CPU per streamed token {ratio:.2f}x "
                f"(target <= 1.2x): {verdict(ratio <= 1.2)}"
            )
    for key in ("gateway", "gateway-engine"):
        cpu = [r["cpu_vs_a"] for r in rows if r["target"] == key and not math.isnan(r["cpu_vs_a"])]
        if cpu:
            worst = max(cpu)
            out.append(
                f"- {key}: CPU per streamed token vs (a), worst level {worst:.2f}x (target <= 1.5x): "
                f"{verdict(worst <= 1.5)}"
            )
        high = [
            (r["concurrency"], r["cpu_vs_a"])
            for r in rows
            if r["target"] == key and r["concurrency"] >= 16 and not math.isnan(r["cpu_vs_a"])
        ]
        if high:
            levels = ", ".join(f"{v:.2f}x at {c}" for c, v in sorted(high))
            out.append(
                f"- {key}: CPU per streamed token vs (a) at concurrency 16 and above: {levels} "
                f"(target <= 1.0x): {verdict(all(v <= 1.0 for _, v in high))}"
            )
        r1 = by.get((key, 1))
        if r1 and not math.isnan(r1["ttft_p50_over_a_ms"]):
            d = r1["ttft_p50_over_a_ms"]
            out.append(
                f"- {key}: TTFT p50 overhead at concurrency 1: {d:+.2f} ms (target <= 2 ms): "
                + verdict(d <= 2)
            )
        r64 = by.get((key, 64))
        if r64 and not math.isnan(r64["throughput_vs_a"]):
            t = r64["throughput_vs_a"]
            out.append(
                f"- {key}: throughput vs (a) at concurrency 64: {t:.2f}x (target >= 0.8x): "
                + verdict(t >= 0.8)
            )
        for c in sorted({r["concurrency"] for r in rows}):
            g, lite = by.get((key, c)), by.get(("litellm", c))
            if g and lite and lite["output_tokens_per_s"] and lite["client_cpu_ms_per_token"]:
                tput = g["output_tokens_per_s"] / lite["output_tokens_per_s"]
                cpu_r = g["client_cpu_ms_per_token"] / lite["client_cpu_ms_per_token"]
                out.append(
                    f"- {key} vs LiteLLM at concurrency {c}: throughput {tput:.2f}x (target >= 3x), "
                    f"CPU per token {cpu_r:.2f}x (target <= 0.33x): {verdict(tput >= 3 and cpu_r <= 1 / 3)}"
                )
    for c in sorted({r["concurrency"] for r in rows}):
        chat, messages = by.get(("gateway-chat", c)), by.get(("gateway-messages", c))
        if chat and messages and chat["client_cpu_ms_per_token"]:
            ratio = messages["client_cpu_ms_per_token"] / chat["client_cpu_ms_per_token"]
            out.append(
                f"- gateway-messages vs gateway-chat at concurrency {c}: "
                f"CPU per streamed token {ratio:.2f}x "
                f"(target <= 1.2x): {verdict(ratio <= 1.2)}"
            )
    return out


def machine_info() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gb = math.nan
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_gb = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def plot_cpu(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(dict.fromkeys(r["target"] for r in rows))
    levels = sorted({r["concurrency"] for r in rows})
    by = {(r["target"], r["concurrency"]): r for r in rows}
    width = 0.8 / max(len(targets), 1)
    fig, ax = plt.subplots(figsize=(10, 5))
    for i, t in enumerate(targets):
        cells = [by.get((t, c), {}) for c in levels]
        ys = [r.get("client_cpu_ms_per_token", math.nan) for r in cells]
        # Whiskers: the min-max over the rounds (rows of a single round have none).
        lo = [y - r.get("client_cpu_ms_per_token_min", y) for y, r in zip(ys, cells, strict=True)]
        hi = [r.get("client_cpu_ms_per_token_max", y) - y for y, r in zip(ys, cells, strict=True)]
        ax.bar([j + i * width for j in range(len(levels))], ys, width, label=t, yerr=[lo, hi], capsize=2)
    ax.set_xticks([j + width * (len(targets) - 1) / 2 for j in range(len(levels))], [str(c) for c in levels])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("client-side CPU ms per streamed token (median, min-max)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    out: Path, cfg: BenchConfig, outcomes: Sequence[TargetOutcome], soak: dict[str, Any] | None
) -> str:
    out.mkdir(parents=True, exist_ok=True)
    rows = comparison_rows(outcomes)
    per_round = round_rows(outcomes)
    n_rounds = rounds_of(outcomes)
    machine = machine_info()
    table = markdown_table(rows, outcomes)
    notes = round_notes(outcomes)
    checks = target_checks(rows)
    md = [
        f"# Benchmark {machine['date']}",
        "",
        f"Machine: {machine['cpu'] or 'unknown CPU'}, {machine['cores']} cores, {machine['memory_gb']} GB, "
        f"Python {machine['python']}, Linux {machine['kernel']}.",
        f"Workload: streaming completions, {cfg.prompt_tokens}-token prompts, {cfg.max_tokens} output tokens "
        f"(ignore_eos / min_tokens), synthetic engine step {cfg.step_ms:g} ms, concurrencies "
        f"{', '.join(map(str, cfg.concurrencies))}; load generator and servers share this machine.",
        "Client CPU: user+sys from /proc over the measured requests, of the gateway or proxy process tree; "
        "for (a) and (c), of the load-generator process itself.",
        rounds_line(n_rounds),
        "",
        table,
        *(["", *notes] if notes else []),
    ]
    if n_rounds > 1 and rows:
        md += ["", "## Spread across rounds", "", spread_table(rows)]
    md += [
        "",
        f"## Against the targets (medians over {n_rounds} round{'s' if n_rounds != 1 else ''})",
        "",
        *(checks or ["- (no gateway results to compare)"]),
    ]
    if soak is not None:
        md += ["", "## Open streams soak", "", "```", json.dumps(soak, indent=2), "```"]
    md += [
        "",
        "![latency vs throughput](latency_vs_throughput.png)",
        "",
        "![CPU per token](cpu_per_token.png)",
        "",
    ]
    text = "\n".join(md)
    (out / "bench.md").write_text(text, encoding="utf-8")
    write_csv(out / "bench.csv", rows)  # the table: medians over the rounds
    write_csv(out / "bench_rounds.csv", per_round)  # the raw figures, one row per round
    write_json(
        out / "bench.json",
        {
            "machine": machine,
            "config": asdict(cfg),
            "rounds": n_rounds,
            "rows": rows,
            "round_rows": per_round,
            "runs": [
                {"target": o.target.key, "round": lv.round, **summary_dict(lv.summary)}
                for o in sorted(outcomes, key=lambda o: o.round)
                for lv in o.levels
            ],
            # Targets that failed in every round; `failures` lists every failed (target, round).
            "unavailable": {
                key: failed[-1].unavailable for key, failed in unavailable_targets(outcomes).items()
            },
            "failures": [
                {
                    "target": o.target.key,
                    "round": o.round,
                    "levels_done": len(o.levels),
                    "reason": o.unavailable,
                }
                for o in outcomes
                if o.unavailable is not None
            ],
            "soak": soak,
        },
    )
    req_rows: list[dict[str, Any]] = []
    for o in sorted(outcomes, key=lambda o: o.round):
        for c, recs in o.records.items():
            req_rows.extend(request_rows(f"{o.target.key} c={c} r={o.round}", recs))
    write_csv(out / "requests.csv", req_rows)
    # The plots show the medians, like the table.
    series: dict[str, list[RunSummary]] = {}
    for (_key, _conc), levels in _grouped(outcomes).items():
        series.setdefault(levels[0].label, []).append(median_summary([lv.summary for lv in levels]))
    if series:
        plot_sweep(
            out / "latency_vs_throughput.png", series, title="latency vs throughput (labels: concurrency)"
        )
        plot_cpu(out / "cpu_per_token.png", rows)
    return text


# ------------------------------------------------------------------------------------------------ main


async def run_bench(cfg: BenchConfig, out: Path) -> str:
    """Run every selected target, in cfg.repeats interleaved rounds, against one stack; then the soak,
    once. `out` (and out/work) must exist."""
    workdir = out / "work"
    workload = Workload(max_tokens=cfg.max_tokens, stream=True, ignore_eos=True, include_usage=True)
    selected = [t for t in TARGETS if t.key in cfg.targets]
    outcomes: list[TargetOutcome] = []
    soak: dict[str, Any] | None = None
    with start_stack(cfg, workdir) as stack:
        biggest = max(cfg.min_requests, max(cfg.concurrencies) * cfg.requests_per_stream) + cfg.warmup
        prompts = synthetic_prompts(biggest, cfg.prompt_tokens, seed=1, tokenizer_dir=stack.tokenizer_dir)
        # Interleaved rounds, each level by level across the targets (see run_round), so a drift of
        # the shared machine over the run hits all targets alike. One stack for all rounds.
        for r in range(1, cfg.repeats + 1):
            round_dir = workdir if cfg.repeats == 1 else workdir / f"round{r}"
            round_dir.mkdir(parents=True, exist_ok=True)
            outcomes.extend(await run_round(selected, stack, cfg, workload, prompts, round_dir, r))
        if cfg.soak_streams:
            soak = await run_soak(stack, cfg, workdir)
    return write_report(out, cfg, outcomes, soak)


async def run_soak(stack: Stack, cfg: BenchConfig, workdir: Path) -> dict[str, Any]:
    from loadtest.soak import soak_open_streams

    soak_cfg = replace(cfg, concurrencies=(cfg.soak_streams,), gateway_workers=1)
    target = next(t for t in TARGETS if t.key == "gateway")
    workload = Workload(max_tokens=cfg.soak_max_tokens, stream=True, ignore_eos=True)
    try:
        async with start_target(target, stack, soak_cfg, workload, workdir) as running:
            assert isinstance(running.client, OpenAITarget)
            # A few requests first, so the baseline includes warmed-up caches and connection pools.
            await run_load(
                running.client,
                synthetic_prompts(8, 16, seed=3),
                LoadSpec(concurrency=8, requests=8),
                progress=False,
            )
            base_url = running.client.base_url
            result = await soak_open_streams(
                base_url,
                stack.served_name,
                running.pid,
                streams=cfg.soak_streams,
                max_tokens=cfg.soak_max_tokens,
            )
    except (NotReady, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    d = asdict(result)
    d.pop("samples")
    d["rss_growth_mb"] = round(result.rss_growth_mb, 2)
    d["target_rss_growth_mb"] = 150
    d["met"] = result.ok and result.rss_growth_mb < 150
    return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__)
    p.add_argument(
        "--quick", action="store_true", help="smoke run: concurrencies 1,16, short outputs, 1 round"
    )
    p.add_argument(
        "--repeat",
        type=int,
        metavar="N",
        help="interleaved rounds of the whole sweep; cells are medians over them (default 3, --quick 1)",
    )
    p.add_argument("--concurrency", help="comma list (default 1,16,64,256)")
    p.add_argument(
        "--targets",
        help=f"comma list of {', '.join(t.key for t in TARGETS)} (default: all)",
    )
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--prompt-tokens", type=int)
    p.add_argument("--step-ms", type=float, help="synthetic engine step interval")
    p.add_argument("--level-duration", type=float, help="seconds per level before no new requests start")
    p.add_argument("--gateway-workers", type=int, help="gateway worker processes (default 1)")
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra flag for `gateway serve` (repeatable)"
    )
    p.add_argument("--soak", action="store_true", help="also hold 1,000 open streams through one gateway")
    p.add_argument("--soak-streams", type=int, default=1000)
    p.add_argument("--out", help="results directory (default results/<timestamp>)")
    p.add_argument(
        "--external",
        nargs=3,
        metavar=("GRPC_HOSTPORT", "HTTP_URL", "TOKENIZER_DIR"),
        help="bench an already running Triton (its model must be the synthetic engine to be comparable)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig.quick() if args.quick else BenchConfig()
    changes: dict[str, Any] = {}
    if args.concurrency:
        changes["concurrencies"] = tuple(int(c) for c in args.concurrency.split(","))
    if args.targets:
        keys = tuple(k.strip() for k in args.targets.split(","))
        unknown = set(keys) - {t.key for t in TARGETS}
        if unknown:
            raise SystemExit(f"unknown targets: {', '.join(sorted(unknown))}")
        changes["targets"] = keys
    for name, attr in (
        ("max_tokens", "max_tokens"),
        ("prompt_tokens", "prompt_tokens"),
        ("step_ms", "step_ms"),
        ("level_duration", "level_duration_s"),
        ("gateway_workers", "gateway_workers"),
        ("out", "out_dir"),
    ):
        if getattr(args, name) is not None:
            changes[attr] = getattr(args, name)
    if args.gateway_arg:
        changes["gateway_extra_args"] = split_args(args.gateway_arg)
    if args.soak:
        changes["soak_streams"] = args.soak_streams
    if args.external:
        changes["external"] = tuple(args.external)
    if args.repeat is not None:
        if args.repeat < 1:
            raise SystemExit("--repeat must be at least 1")
        changes["repeats"] = args.repeat
    return replace(cfg, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    bench_setup()
    cfg = config_from_args(build_parser().parse_args(argv))
    out = Path(cfg.out_dir or f"results/{time.strftime('%Y%m%d-%H%M%S')}")
    (out / "work").mkdir(parents=True, exist_ok=True)
    text = asyncio.run(run_bench(cfg, out))
    sys.stdout.write(text + "\n")
    log.info("results in %s/", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
