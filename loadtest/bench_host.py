"""`python -m loadtest.bench_host` (`make bench-host`): how the gateway scales with its workers.

Workers 1, 2, 4, 8 x concurrency 64, 256 x the APIs (completions, chat completions, Responses,
Messages), all on the engine route, against the CPU Triton with the synthetic engine (a fixed step
time, no model compute) in enough engine instances (and Triton replicas) that Triton is not the
ceiling. Every gateway is started first; then each (concurrency, API) level is measured on every
worker count in turn, seconds apart, in `--repeat` rounds; each cell is the median over the rounds,
as `make bench` does. The load comes from `--load-processes` processes (one Python load generator
streams about 10k tokens/s, less than eight workers serve), which start and end their measured
window together.

How it is measured (each an option, the default first): the gateway streams over Triton's HTTP
generate_stream (`--transport http|grpc`); workers, Triton and the load generator are pinned to
disjoint cpus, a physical core per worker where SMT allows (`--placement auto|off`,
`loadtest/placement.py`); the load generator opens a new connection per request, as many clients do,
so SO_REUSEPORT spreads requests rather than a few long-lived connections
(`--connections fresh|keep-alive`). Besides the issue's cells, a matched-load view gives each worker
the same number of streams (`--per-worker-concurrency`, default 4 and 8), so CPU per token is
compared at equal load per worker; it is an added view, not the issue's targets.

Per cell: output tokens/s, TTFT p50/p99, time per output token (TPOT) p50, the gateway's CPU per
streamed token (all its processes, from /proc), each worker's cores and client connections. A cell
whose TPOT p50 exceeds 1.2 x the engine step while no worker is saturated is marked "Triton-bound",
one whose load generator used (nearly) all the cores it can "load-generator-bound"; neither is
counted as a gateway figure. One whose busiest worker uses a whole core is "gateway-bound" (the
gateway's capacity); the rest are "engine-paced" (the gateway kept up). The scaling verdicts, 1
against 8 workers on the issue's cells: CPU per token within 1.2x, and tokens per gateway core >=
0.8x (linear scaling of capacity; raw throughput cannot scale linearly where 8 workers outrun the
engine's fixed step). Writes results/host-<timestamp>/ (bench_host.md, .csv, .json, bench_host.png)
and prints the report.
`--engine native` serves the same synthetic tokens from the native engine instead (`engines/native/`: a
Triton backend in C, no Python stub per response), so Triton's CPU per streamed token is the C API's
rather than the Python backend's; `--engine gpu` uses the reference engine with torch on the GPU and a
random model of a few hundred M parameters (the header names the GPU, the model's size and the dtype).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from deploy.devstack import TRITON_HTTP_SEND_BUFFER
from loadtest import placement, procstat
from loadtest.metrics import RequestRecord, RunSummary, summarize
from loadtest.placement import CpuPlan, PlacementError, physical_cores, plan_cpus
from loadtest.subproc import bench_setup, free_port, spawn_logged, split_args, stop_process, wait_http_ready
from loadtest.workload import Endpoint, Prompt, Workload, synthetic_prompts

log = logging.getLogger(__name__)

# A worker busier than this is taken as saturated (an event loop has one core; /proc's ticks and the
# window's edges make a pegged loop read a little under 1.0).
SATURATED_CORES = 0.85
# The load generator sets the pace before it is pegged: its processes queue on its cpus. On the lent
# 16-core host, eight workers at c=1024 with the load generator at 0.82-0.89 of its 2 cpus measured
# 0.64-0.68x linear; with 3 cpus (0.57 of them used) the same cells measured 0.83-0.85x.
LOADGEN_SATURATED = 0.8
# The load generator's cpus by default: what carried eight workers there (3 for 8), never fewer than
# an eighth of the host's.
LOADGEN_CPUS_PER_WORKER = 3 / 8
CONNECTION_LABELS = {
    "fresh": "a new connection per request (as many clients do)",
    "keep-alive": "keep-alive connections, one per stream",
}
ENGINES = ("synthetic", "native", "gpu")
GPU_MODEL_KIND = "gpu"
# Engine instances for --engine gpu unless given: each holds the model and a CUDA context, and the
# GPU runs one instance's kernels at a time.
GPU_ENGINE_INSTANCES = 2
API_LABELS = {
    "completions": "completions",
    "chat": "chat completions",
    "responses": "Responses",
    "messages": "Messages",
}


@dataclass(frozen=True, slots=True)
class HostConfig:
    workers: tuple[int, ...] = (1, 2, 4, 8)
    concurrencies: tuple[int, ...] = (64, 256)
    apis: tuple[str, ...] = ("completions", "chat", "responses", "messages")
    max_tokens: int = 64
    prompt_tokens: int = 32
    step_ms: float = 5.0
    engine_instances: int = 12
    triton_replicas: int = 1
    load_processes: int = 6
    level_duration_s: float = 6.0  # no new requests after this, per cell
    requests_per_stream: int = 30  # requests per cell = concurrency * this (the duration cuts first)
    warmup_per_stream: int = 1
    repeats: int = 3
    bound_factor: float = 1.2
    engine_mode: str = "synthetic"
    # The matched-load view (an added view, not the issue's cells): each worker carries this many
    # streams, so 1..8 workers are compared at the same load per worker.
    per_worker_concurrencies: tuple[int, ...] = (4, 8)
    transport: str = "http"  # the gateway's Triton hot path: HTTP generate_stream, or "grpc"
    connections: str = "fresh"  # the load generator: a new connection per request, or "keep-alive"
    # The load generator's HTTP client: loadtest.lean_http on uvloop (cheap enough per token to
    # saturate eight workers from a few cores), or "aiohttp" on asyncio's loop (the runs before it).
    load_client: str = "lean"
    # net.core.wmem_default while Triton starts (0: leave it): below it Triton's HTTP frontend loses
    # generate_stream responses at these rates.
    triton_send_buffer: int = TRITON_HTTP_SEND_BUFFER
    placement: str = "auto"  # disjoint cpus for workers, Triton and the load generator, or "off"
    # cpus for the load generator when placed (0: sized for the most workers run, see loadgen_cpus_for)
    loadgen_cpus: int = 0
    gateway_extra_args: tuple[str, ...] = ()
    label: str = ""  # what this run is, in the report's title (e.g. "--worker-sockets shared")
    out_dir: str = ""

    @classmethod
    def small(cls) -> HostConfig:
        """What fits on a 2-core machine: it shows the method, not the scaling."""
        return cls(
            workers=(1, 2),
            concurrencies=(16, 64),
            apis=("completions", "chat"),
            max_tokens=32,
            prompt_tokens=16,
            step_ms=10.0,
            engine_instances=2,
            load_processes=1,
            level_duration_s=6.0,
            requests_per_stream=8,
            repeats=1,
            per_worker_concurrencies=(8,),
        )


# ------------------------------------------------------------------------------------ load processes


def _load_child(conn: Connection, start: Any, end: Any) -> None:
    """One load-generator process: runs the cells it is sent, its measured window aligned with the
    others' by two barriers, and sends back its records."""
    from loadtest.anthropic_client import AnthropicTarget
    from loadtest.openai_client import OpenAITarget
    from loadtest.runner import LoadSpec, run_load

    async def cell(msg: dict[str, Any]) -> list[RequestRecord]:
        workload = Workload(
            max_tokens=msg["max_tokens"],
            stream=True,
            ignore_eos=True,
            include_usage=True,
            endpoint=msg["endpoint"] if msg["endpoint"] != "messages" else "completions",
        )
        opts = {"fresh_connections": msg["connections"] == "fresh", "client": msg["load_client"]}
        if msg["endpoint"] == "messages":
            client: Any = AnthropicTarget(msg["base_url"], msg["model"], workload, **opts)
        else:
            client = OpenAITarget(msg["base_url"] + "/v1", msg["model"], workload, **opts)
        await client.open(msg["concurrency"])
        try:

            def on_window(phase: str) -> None:
                (start if phase == "start" else end).wait(msg["barrier_timeout_s"])

            spec = LoadSpec(
                concurrency=msg["concurrency"],
                requests=msg["requests"],
                duration_s=msg["duration_s"],
                warmup=msg["warmup"],
            )
            result = await run_load(client, msg["prompts"], spec, progress=False, on_window=on_window)
            return list(result.records)
        finally:
            await client.aclose()

    while True:
        msg = conn.recv()
        if msg is None:
            return
        try:
            if msg["load_client"] == "lean":
                import uvloop

                records = uvloop.run(cell(msg))
            else:
                records = asyncio.run(cell(msg))
            conn.send(("ok", records))
        except Exception as exc:
            with contextlib.suppress(threading.BrokenBarrierError):
                start.abort()
                end.abort()
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class LoadPool:
    """`n` load-generator processes (spawned once) driving one cell together."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.n = n
        self.start_barrier = ctx.Barrier(n + 1)
        self.end_barrier = ctx.Barrier(n + 1)
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_load_child, args=(child, self.start_barrier, self.end_barrier))
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def run(
        self,
        base: dict[str, Any],
        concurrency: int,
        requests: int,
        warmup: int,
        timeout_s: float,
        on_window: Any,
    ) -> list[RequestRecord]:
        """Split the cell over the processes; call on_window('start'/'end') when all are inside it."""
        for b in (self.start_barrier, self.end_barrier):
            b.reset()
        for i, conn in enumerate(self._conns):
            share = concurrency // self.n + (1 if i < concurrency % self.n else 0)
            conn.send(
                {
                    **base,
                    "concurrency": max(1, share),
                    "requests": max(1, requests * share // concurrency),
                    "warmup": max(1, warmup * share // concurrency),
                    "barrier_timeout_s": timeout_s,
                }
            )
        try:
            self.start_barrier.wait(timeout_s)
            on_window("start")
            self.end_barrier.wait(timeout_s)
            on_window("end")
        except threading.BrokenBarrierError:
            pass
        records: list[RequestRecord] = []
        errors = []
        for conn in self._conns:
            status, payload = conn.recv()
            if status == "ok":
                records.extend(payload)
            else:
                errors.append(payload)
        if errors:
            raise RuntimeError("; ".join(dict.fromkeys(errors)))
        return records

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


# --------------------------------------------------------------------------------------------- stack


@dataclass(frozen=True, slots=True)
class HostStack:
    grpc_urls: tuple[str, ...]
    tokenizer_dir: str
    triton_pids: tuple[int, ...]
    served_name: str = "bench"
    engine: str = "tensorrt_llm"
    ensemble: str = "ensemble"
    http_urls: tuple[str, ...] = ()  # each Triton's HTTP endpoint, in grpc_urls' order


@contextlib.contextmanager
def start_stack(cfg: HostConfig, workdir: Path) -> Iterator[HostStack]:
    """`triton_replicas` CPU tritonservers, each with `engine_instances` synthetic engines."""
    from deploy import devstack

    values: dict[str, object] = {
        "synthetic_step_ms": cfg.step_ms,
        "max_active_requests": 1024,
        "engine_instance_count": cfg.engine_instances,
    }
    if cfg.engine_mode == "gpu":
        # The reference engine on the GPU: the larger random model, built here on first use.
        values.update({"engine_device": "cuda", "engine_dtype": "bfloat16"})
        repo = devstack.prepare_dev_repository(
            workdir / "model_repo", engine_mode="model", tokenizer_kind=GPU_MODEL_KIND, variables=values
        )
    elif cfg.engine_mode == "native":
        # The engine model alone, on the C backend: it has no max_active_requests (no limit).
        del values["max_active_requests"]
        repo = devstack.prepare_dev_repository(workdir / "model_repo", engine_mode="native", variables=values)
    else:
        repo = devstack.prepare_dev_repository(
            workdir / "model_repo", engine_mode="synthetic", variables=values
        )
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                devstack.TritonServer(
                    [repo.path],
                    log_file=workdir / f"tritonserver-{i}.log",
                    http_send_buffer=cfg.triton_send_buffer or None,
                )
            )
            for i in range(cfg.triton_replicas)
        ]
        yield HostStack(
            grpc_urls=tuple(s.grpc_url for s in servers),
            tokenizer_dir=str(repo.model_dir),
            triton_pids=tuple(s.pid for s in servers if s.pid is not None),
            ensemble=repo.ensemble,
            http_urls=tuple(s.http_url for s in servers),
        )


def gateway_command(
    port: int, stack: HostStack, workers: int, extra: Sequence[str] = (), transport: str = "http"
) -> list[str]:
    """`gateway serve` on the engine route, given every Triton replica; with transport "http" its
    streams go over Triton's HTTP generate_stream (--triton-http-url), else over gRPC."""
    spec = (
        f"name={stack.served_name},triton_model={stack.ensemble},tokenizer={stack.tokenizer_dir},"
        f"route=engine,engine_model={stack.engine}"
    )
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    for url in stack.grpc_urls:
        cmd += ["--triton-url", url]
    if transport == "http":
        if len(stack.http_urls) != len(stack.grpc_urls):
            raise ValueError("the HTTP transport needs every Triton's HTTP URL")
        for url in stack.http_urls:
            cmd += ["--triton-http-url", url]
        # Engine steps are milliseconds apart: a stream silent for 30 s lost its end in Triton's
        # HTTP frontend, and it should fail (counted) rather than hold the cell until its time limit.
        cmd += ["--triton-stream-idle-timeout-s", "30"]
    cmd += ["--model", spec, "--log-level", "warning", "--max-concurrent-requests", "4096"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    return cmd + list(extra)


def worker_pids(gateway_pid: int, workers: int) -> list[int]:
    """The processes that serve requests: the gateway itself with one worker, else its spawned workers."""
    if workers == 1:
        return [gateway_pid]
    pids = []
    for pid in procstat.descendants(gateway_pid):
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
    return sorted(pids)


# ----------------------------------------------------------------------------------------- measuring


@dataclass(frozen=True, slots=True)
class Cell:
    workers: int
    api: str
    concurrency: int
    round: int
    summary: RunSummary
    window_s: float
    gateway_cpu_s: float
    worker_cpu_s: tuple[float, ...]
    triton_cpu_s: float
    loadgen_cpu_s: float
    error: str | None = None
    per_worker: int = 0  # > 0: a matched-load cell, `per_worker` streams per worker
    worker_connections: tuple[float, ...] = ()  # connections each worker held, mean over the window

    @property
    def cpu_ms_per_token(self) -> float:
        tokens = self.summary.output_tokens
        return self.gateway_cpu_s * 1000 / tokens if tokens else math.nan

    @property
    def cores_per_worker(self) -> tuple[float, ...]:
        return tuple(c / self.window_s for c in self.worker_cpu_s) if self.window_s > 0 else ()


class ConnectionSampler:
    """How many client connections each worker holds, sampled every `interval_s` over the measured
    window: with keep-alive, where the kernel hashed the load generator's connections; with a new
    connection per request, each worker's share of the requests in flight."""

    def __init__(self, pids: Sequence[int], port: int, interval_s: float = 0.5) -> None:
        self.pids = list(pids)
        self.port = port
        self.interval_s = interval_s
        self.samples: list[tuple[int, ...]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="connections", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.samples.append(procstat.connections(self.pids, self.port))
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def means(self) -> tuple[float, ...]:
        if not self.samples:
            return ()
        return tuple(statistics.fmean(column) for column in zip(*self.samples, strict=True))


def _cpu(pids: Sequence[int], children: bool) -> float:
    return sum(procstat.cpu_times(p, include_children=children).total_s for p in pids)


def measure_cell(
    pool: LoadPool,
    base_url: str,
    gateway_pid: int,
    workers: int,
    api: str,
    concurrency: int,
    prompts: Sequence[Prompt],
    stack: HostStack,
    cfg: HostConfig,
    round_no: int,
    *,
    per_worker: int = 0,
) -> Cell:
    wpids = worker_pids(gateway_pid, workers)
    marks: dict[str, tuple[float, float, tuple[float, ...], float, float]] = {}
    sampler = ConnectionSampler(wpids, int(base_url.rsplit(":", 1)[1]))

    def on_window(phase: str) -> None:
        if phase == "start":
            sampler.start()
        else:
            sampler.stop()
        marks[phase] = (
            time.monotonic(),
            _cpu([gateway_pid], True),
            tuple(_cpu([p], False) for p in wpids),
            _cpu(stack.triton_pids, True),
            _cpu(pool.pids, False),
        )

    endpoint: Endpoint | str = api
    base = {
        "base_url": base_url,
        "model": stack.served_name,
        "endpoint": endpoint,
        "max_tokens": cfg.max_tokens,
        "prompts": list(prompts),
        "duration_s": cfg.level_duration_s,
        "connections": cfg.connections,
        "load_client": cfg.load_client,
    }
    label = f"w={workers} {api} c={concurrency}{f' ({per_worker}/worker)' if per_worker else ''} r={round_no}"
    timeout = cfg.level_duration_s * 6 + 120
    try:
        records = pool.run(
            base,
            concurrency,
            concurrency * cfg.requests_per_stream,
            concurrency * cfg.warmup_per_stream,
            timeout,
            on_window,
        )
        error = None if "end" in marks else "the load processes did not finish together"
    except RuntimeError as exc:
        records, error = [], str(exc)
    finally:
        sampler.stop()
    if "start" not in marks or "end" not in marks:
        empty = summarize([], label=label, mode="concurrency", load=concurrency, duration_s=0.0)
        return Cell(
            workers,
            api,
            concurrency,
            round_no,
            empty,
            0.0,
            math.nan,
            (),
            math.nan,
            math.nan,
            error or "no measured window",
            per_worker,
        )
    (t0, g0, w0, tr0, l0), (t1, g1, w1, tr1, l1) = marks["start"], marks["end"]
    window = t1 - t0
    summary = summarize(records, label=label, mode="concurrency", load=concurrency, duration_s=window)
    cell = Cell(
        workers=workers,
        api=api,
        concurrency=concurrency,
        round=round_no,
        summary=summary,
        window_s=window,
        gateway_cpu_s=g1 - g0,
        worker_cpu_s=tuple(b - a for a, b in zip(w0, w1, strict=True)),
        triton_cpu_s=tr1 - tr0,
        loadgen_cpu_s=l1 - l0,
        error=error,
        per_worker=per_worker,
        worker_connections=sampler.means(),
    )
    log.info(
        "%-40s %7.0f tok/s  TTFT p50 %6.1f ms  TPOT p50 %5.2f ms  CPU %.3f ms/tok  cores/worker %s"
        "  conns/worker %s%s",
        label,
        summary.output_tokens_per_s,
        summary.ttft.p50 * 1000,
        summary.tpot.p50 * 1000,
        cell.cpu_ms_per_token,
        " ".join(f"{c:.2f}" for c in cell.cores_per_worker),
        " ".join(f"{n:.1f}" for n in cell.worker_connections),
        f"  errors {dict(summary.errors)}" if summary.errors else "",
    )
    return cell


@dataclass(slots=True)
class Gateway:
    workers: int
    base_url: str
    proc: Any
    log_path: Path


def start_gateway(
    stack: HostStack, workers: int, workdir: Path, extra: Sequence[str] = (), transport: str = "http"
) -> Gateway:
    port = free_port()
    log_path = workdir / f"gateway-w{workers}.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    proc = spawn_logged(gateway_command(port, stack, workers, extra, transport), log_path, env)
    return Gateway(workers, f"http://127.0.0.1:{port}", proc, log_path)


class Interrupted(Exception):
    """SIGTERM or SIGINT: stop measuring, report the cells measured so far."""


def loadgen_cpus_for(cfg: HostConfig, total: int) -> int:
    """The load generator's cpus: as asked, else enough for the cells run (LOADGEN_CPUS_PER_WORKER of
    the most workers measured, the streams they carry growing with them), at least an eighth of the
    host's; plan_cpus leaves Triton at least one."""
    if cfg.loadgen_cpus:
        return cfg.loadgen_cpus
    return max(1, total // 8, math.ceil(max(cfg.workers) * LOADGEN_CPUS_PER_WORKER))


def cpu_plan(cfg: HostConfig) -> tuple[CpuPlan | None, str]:
    """The layout `make bench-host` pins its processes to, or None with the reason it runs unpinned."""
    if cfg.placement == "off":
        return None, "not pinned (--placement off): the scheduler places every process"
    cores = physical_cores()
    total = sum(len(c) for c in cores)
    loadgen = loadgen_cpus_for(cfg, total)
    try:
        plan = plan_cpus(cores, max(cfg.workers), loadgen)
    except PlacementError as exc:
        return None, f"not pinned: {exc}"
    return plan, plan.describe()


def place(plan: CpuPlan, stack: HostStack, pool: LoadPool, gateways: Sequence[Gateway]) -> None:
    """Pin Triton (with its backend stubs), the load generator (and this process, which reads the
    counters) and each gateway: worker i of every gateway on plan.workers[i], the supervisor on their
    union. The gateways are measured one at a time, so their workers may share the cpus."""
    triton = sum(placement.pin_tree(pid, plan.triton) for pid in stack.triton_pids)
    loadgen = sum(placement.pin_tree(pid, plan.loadgen, descendants=False) for pid in pool.pids)
    placement.pin_tree(os.getpid(), plan.loadgen, descendants=False)
    gateway = 0
    for gw in gateways:
        placement.pin_tree(gw.proc.pid, plan.gateway)
        for i, pid in enumerate(worker_pids(gw.proc.pid, gw.workers)):
            gateway += placement.pin_tree(pid, plan.worker_cpus(i))
    log.info("pinned %d Triton, %d load-generator and %d worker threads", triton, loadgen, gateway)


def run_host_bench(cfg: HostConfig, out: Path, cells: list[Cell], plan: CpuPlan | None = None) -> list[Cell]:
    """Measure into `cells` (which keeps what was measured when the run is interrupted)."""
    workdir = out / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    with start_stack(cfg, workdir) as stack:
        prompts = synthetic_prompts(
            max([*cfg.concurrencies, *(k * max(cfg.workers) for k in cfg.per_worker_concurrencies)])
            * (cfg.requests_per_stream + cfg.warmup_per_stream),
            cfg.prompt_tokens,
            seed=1,
            tokenizer_dir=stack.tokenizer_dir,
        )
        pool = LoadPool(cfg.load_processes)
        gateways: list[Gateway] = []
        try:
            gateways = [
                start_gateway(stack, w, workdir, cfg.gateway_extra_args, cfg.transport) for w in cfg.workers
            ]
            for gw in gateways:
                wait_http_ready(gw.proc, gw.base_url + "/health/ready", 300.0, gw.log_path)
            if plan is not None:
                place(plan, stack, pool, gateways)
            for r in range(1, cfg.repeats + 1):
                for c in cfg.concurrencies:
                    for api in cfg.apis:
                        for gw in gateways:
                            cells.append(
                                measure_cell(
                                    pool, gw.base_url, gw.proc.pid, gw.workers, api, c, prompts, stack, cfg, r
                                )
                            )
                for k in cfg.per_worker_concurrencies:
                    for api in cfg.apis:
                        for gw in gateways:
                            cells.append(
                                measure_cell(
                                    pool,
                                    gw.base_url,
                                    gw.proc.pid,
                                    gw.workers,
                                    api,
                                    k * gw.workers,
                                    prompts,
                                    stack,
                                    cfg,
                                    r,
                                    per_worker=k,
                                )
                            )
        finally:
            for gw in gateways:
                stop_process(gw.proc)
            pool.close()
    return cells


# ------------------------------------------------------------------------------------------ reporting


def _median(xs: Sequence[float]) -> float:
    vals = [x for x in xs if not math.isnan(x)]
    return float(statistics.median(vals)) if vals else math.nan


def rows(cells: Sequence[Cell], cfg: HostConfig, loadgen_capacity: float = math.nan) -> list[dict[str, Any]]:
    """One row per (api, level, workers), the level a total concurrency (the issue's cells) or a
    number of streams per worker (the matched-load view): medians over the rounds. A row whose load
    generator used `loadgen_capacity` cores or nearly (its processes or its cpus) is marked so."""
    groups: dict[tuple[str, int, int, int], list[Cell]] = {}
    for c in cells:
        conc = 0 if c.per_worker else c.concurrency
        groups.setdefault((c.api, c.per_worker, conc, c.workers), []).append(c)
    out: list[dict[str, Any]] = []
    for (api, per_worker, _, workers), cs in groups.items():
        tpot = _median([c.summary.tpot.p50 * 1000 for c in cs])
        cores = [c.cores_per_worker for c in cs if c.cores_per_worker]
        busiest = _median([max(x) for x in cores]) if cores else math.nan
        idlest = _median([min(x) for x in cores]) if cores else math.nan
        conns = [c.worker_connections for c in cs if c.worker_connections]
        loadgen_cores = _median([c.loadgen_cpu_s / c.window_s for c in cs if c.window_s])
        row: dict[str, Any] = {
            "api": api,
            "concurrency": int(_median([c.concurrency for c in cs])),
            "per_worker": per_worker,
            "workers": workers,
            "rounds": len(cs),
            "requests": sum(c.summary.requests for c in cs),
            "errors": sum(sum(c.summary.errors.values()) for c in cs),
            "failed": "; ".join(dict.fromkeys(c.error for c in cs if c.error)),
            "output_tokens_per_s": _median([c.summary.output_tokens_per_s for c in cs]),
            "ttft_p50_ms": _median([c.summary.ttft.p50 * 1000 for c in cs]),
            "ttft_p99_ms": _median([c.summary.ttft.p99 * 1000 for c in cs]),
            "tpot_p50_ms": tpot,
            "gateway_cpu_ms_per_token": _median([c.cpu_ms_per_token for c in cs]),
            "gateway_cores": _median([c.gateway_cpu_s / c.window_s for c in cs if c.window_s]),
            "cores_per_worker_min": idlest,
            "cores_per_worker_max": busiest,
            "evenness": idlest / busiest if busiest else math.nan,
            "connections_per_worker_min": _median([min(x) for x in conns]) if conns else math.nan,
            "connections_per_worker_max": _median([max(x) for x in conns]) if conns else math.nan,
            "triton_cores": _median([c.triton_cpu_s / c.window_s for c in cs if c.window_s]),
            "loadgen_cores": loadgen_cores,
            "loadgen_saturated": loadgen_cores >= LOADGEN_SATURATED * loadgen_capacity,
        }
        row["bound"] = classify(row, cfg)
        row["triton_bound"] = row["bound"] == "Triton-bound"
        row["counted"] = row["bound"] in ("gateway-bound", "engine-paced") and not row["failed"]
        out.append(row)
    w0 = min(cfg.workers)
    base = {
        (r["api"], r["per_worker"], r["concurrency"] if not r["per_worker"] else 0): r
        for r in out
        if r["workers"] == w0
    }
    for r in out:
        b = base.get((r["api"], r["per_worker"], r["concurrency"] if not r["per_worker"] else 0))
        r["cpu_vs_1"] = (
            _ratio(r["gateway_cpu_ms_per_token"], b["gateway_cpu_ms_per_token"]) if b else math.nan
        )
        # Throughput against w/w0 times the first worker count's: 1.0 is linear.
        r["vs_linear"] = (
            _ratio(r["output_tokens_per_s"], b["output_tokens_per_s"] * r["workers"] / w0) if b else math.nan
        )
    return sorted(
        out,
        key=lambda r: (
            r["per_worker"] > 0,
            list(cfg.apis).index(r["api"]),
            r["per_worker"],
            r["concurrency"],
            r["workers"],
        ),
    )


def classify(row: dict[str, Any], cfg: HostConfig) -> str:
    """What set the cell's pace. "load-generator-bound": the load generator used (nearly) all the
    cores it had, so it, not the gateway or Triton, may have set the pace (not counted; first: a
    starved client also leaves a worker busy with fewer, later requests); "gateway-bound": its
    busiest worker used a whole core (the cell shows the gateway's capacity);
    "Triton-bound": tokens came slower than bound_factor x the engine step while no worker was
    saturated (not a gateway figure); "engine-paced": the gateway kept up with the engine."""
    if row.get("loadgen_saturated"):
        return "load-generator-bound"
    if not math.isnan(row["cores_per_worker_max"]) and row["cores_per_worker_max"] >= SATURATED_CORES:
        return "gateway-bound"
    if not math.isnan(row["tpot_p50_ms"]) and row["tpot_p50_ms"] > cfg.bound_factor * cfg.step_ms:
        return "Triton-bound"
    return "engine-paced"


def _ratio(x: float, y: float) -> float:
    return x / y if y and not math.isnan(x) and not math.isnan(y) else math.nan


def _f(x: float, fmt: str) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else format(x, fmt)


def markdown_table(table: Sequence[dict[str, Any]], cfg: HostConfig) -> str:
    head = (
        "| API | conc | workers | ok/req | out tok/s | vs linear | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
        "gateway CPU ms/tok | vs 1 worker | gateway cores | cores/worker min-max | conns/worker min-max | "
        "Triton cores | load-gen cores | cell |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in table:
        verdict = r["bound"]
        if r["failed"]:
            verdict = f"failed: {r['failed']}".replace("|", "/")
        conc = f"{r['concurrency']} ({r['per_worker']}/worker)" if r["per_worker"] else str(r["concurrency"])
        lines.append(
            f"| {API_LABELS.get(r['api'], r['api'])} | {conc} | {r['workers']} | "
            f"{r['requests'] - r['errors']}/{r['requests']} | {_f(r['output_tokens_per_s'], '.0f')} | "
            f"{_f(r['vs_linear'], '.2f')}x | {_f(r['ttft_p50_ms'], '.1f')} | {_f(r['ttft_p99_ms'], '.1f')} | "
            f"{_f(r['tpot_p50_ms'], '.2f')} | {_f(r['gateway_cpu_ms_per_token'], '.3f')} | "
            f"{_f(r['cpu_vs_1'], '.2f')}x | {_f(r['gateway_cores'], '.2f')} | "
            f"{_f(r['cores_per_worker_min'], '.2f')}-{_f(r['cores_per_worker_max'], '.2f')} | "
            f"{_f(r.get('connections_per_worker_min', math.nan), '.1f')}-"
            f"{_f(r.get('connections_per_worker_max', math.nan), '.1f')} | "
            f"{_f(r['triton_cores'], '.2f')} | {_f(r.get('loadgen_cores', math.nan), '.2f')} | {verdict} |"
        )
    return "\n".join(lines)


def _not_counted(pair: dict[int, dict[str, Any]], lo: int, hi: int) -> str | None:
    reasons = [
        f"{w} worker(s) {'failed' if pair[w]['failed'] else pair[w]['bound']}"
        for w in (lo, hi)
        if not pair[w].get("counted", not pair[w]["triton_bound"] and not pair[w]["failed"])
    ]
    return f"not counted ({'; '.join(reasons)})" if reasons else None


def verdicts(table: Sequence[dict[str, Any]], cfg: HostConfig) -> list[str]:
    """The issue's targets over its cells (a total concurrency) that count (not Triton-bound, not
    load-generator-bound), first against last worker count."""
    lo, hi = min(cfg.workers), max(cfg.workers)
    lines = []
    for api in cfg.apis:
        for conc in cfg.concurrencies:
            pair = {
                r["workers"]: r
                for r in table
                if r["api"] == api and r["concurrency"] == conc and not r.get("per_worker")
            }
            if lo not in pair or hi not in pair:
                continue
            a, b = pair[lo], pair[hi]
            name = f"{API_LABELS.get(api, api)} c={conc}"
            skipped = _not_counted(pair, lo, hi)
            if skipped:
                lines.append(f"- {name}: {skipped}")
                continue
            cpu = b["cpu_vs_1"]
            lines.append(
                f"- {name}: CPU per token {a['gateway_cpu_ms_per_token']:.3f} -> "
                f"{b['gateway_cpu_ms_per_token']:.3f} ms ({cpu:.2f}x; target <= 1.20x: "
                f"{'met' if cpu <= 1.2 else 'NOT met'}); tokens per gateway core at {hi} workers "
                f"{1 / cpu:.2f}x of {lo}'s (linear scaling of capacity; target >= 0.8x: "
                f"{'met' if 1 / cpu >= 0.8 else 'NOT met'}); throughput {b['output_tokens_per_s']:.0f} "
                f"vs {a['output_tokens_per_s']:.0f} tokens/s ({b['vs_linear']:.2f}x linear; {lo} worker(s) "
                f"{a['bound']}, {hi} {b['bound']}); cores per worker at {hi}: "
                f"{b['cores_per_worker_min']:.2f}-{b['cores_per_worker_max']:.2f}"
            )
    return lines


def _why(row: dict[str, Any]) -> str:
    return "failed" if row["failed"] else str(row["bound"])


def matched_lines(table: Sequence[dict[str, Any]], cfg: HostConfig) -> list[str]:
    """The matched-load view: CPU per token at the same streams per worker, per worker count. An added
    view beside the issue's cells, not its targets: it says how per-token cost moves with workers
    when each worker carries the same load."""
    lines = []
    for api in cfg.apis:
        for k in cfg.per_worker_concurrencies:
            rs = [r for r in table if r["api"] == api and r.get("per_worker") == k]
            if not rs:
                continue
            steps = ", ".join(
                f"{r['workers']}w {_f(r['gateway_cpu_ms_per_token'], '.3f')} ms ({_f(r['cpu_vs_1'], '.2f')}x"
                f"{'' if r.get('counted') else '; ' + _why(r) + ', not counted'})"
                for r in rs
            )
            lines.append(f"- {API_LABELS.get(api, api)}, {k} streams per worker: CPU per token {steps}")
    return lines


def capacity_lines(cells: Sequence[Cell], cfg: HostConfig, plan: CpuPlan | None) -> list[str]:
    """How much the host's engine and load generator can carry: their CPU per token over the
    cells, against the cpus they have."""
    measured = [c for c in cells if c.summary.output_tokens and c.window_s]
    if not measured:
        return []
    cpus = os.cpu_count() or 1
    triton_ms = _median([c.triton_cpu_s * 1000 / c.summary.output_tokens for c in measured])
    loadgen_ms = _median([c.loadgen_cpu_s * 1000 / c.summary.output_tokens for c in measured])
    triton_cpus = len(plan.triton) if plan else cpus
    loadgen_cpus = min(cfg.load_processes, len(plan.loadgen) if plan else cpus)
    gateway = f"{len(plan.gateway)} cpus" if plan else "the same cpus (unpinned)"
    return [
        f"- Triton: {triton_ms:.3f} ms of CPU per token (median over the cells) on {triton_cpus} cpus: at "
        f"most about {_ratio(triton_cpus * 1000, triton_ms):.0f} tokens/s on this host.",
        f"- Load generator: {loadgen_ms:.3f} ms of CPU per token ({cfg.connections} connections) on "
        f"{loadgen_cpus} cpus ({cfg.load_processes} processes): at most about "
        f"{_ratio(loadgen_cpus * 1000, loadgen_ms):.0f} tokens/s.",
        f"- Gateway workers: {gateway}; at the engine step ({cfg.step_ms:g} ms) each stream asks "
        f"{1000 / cfg.step_ms:.0f} tokens/s, so {max(cfg.workers)} workers x k streams ask "
        f"{max(cfg.workers) * 1000 / cfg.step_ms:.0f} x k tokens/s.",
    ]


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        info["memory_gib"] = round(kb / 2**20, 1)
    return info


def plot(path: Path, table: Sequence[dict[str, Any]], cfg: HostConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    series = [(api, 0, conc) for api in cfg.apis for conc in cfg.concurrencies]
    series += [(api, k, 0) for api in cfg.apis for k in cfg.per_worker_concurrencies]
    for api, k, conc in series:
        rs = [
            r
            for r in table
            if r["api"] == api and r.get("per_worker", 0) == k and (k or r["concurrency"] == conc)
        ]
        if not rs:
            continue
        ws = [r["workers"] for r in rs]
        label = f"{API_LABELS.get(api, api)} {f'{k}/worker' if k else f'c={conc}'}"
        style = "--" if k else "-"
        axes[0].plot(ws, [r["output_tokens_per_s"] for r in rs], style, marker="o", label=label)
        axes[1].plot(ws, [r["gateway_cpu_ms_per_token"] for r in rs], style, marker="o", label=label)
        axes[2].plot(ws, [r["evenness"] for r in rs], style, marker="o", label=label)
        for ax, key in ((axes[0], "output_tokens_per_s"), (axes[1], "gateway_cpu_ms_per_token")):
            for r in rs:
                if not r.get("counted", not r["triton_bound"]):
                    ax.scatter([r["workers"]], [r[key]], marker="x", s=80, color="red")
    titles = (
        "output tokens/s (x: not counted; dashed: per worker)",
        "gateway CPU ms per token",
        "cores/worker min/max",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xlabel("workers")
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(cfg.workers), [str(w) for w in cfg.workers])
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[2].set_ylim(0, 1.05)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def gpu_name() -> str:
    """The host's first GPU as nvidia-smi names it ("" without one)."""
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return out.strip().splitlines()[0] if out.strip() else ""
    return ""


def engine_description(cfg: HostConfig) -> str:
    """The report header's engine: synthetic pacing, or the reference engine's GPU, model and dtype."""
    if cfg.engine_mode == "native":
        return f"native (the C backend of engines/native/, synthetic tokens), step {cfg.step_ms:g} ms"
    if cfg.engine_mode != "gpu":
        return f"{cfg.engine_mode}, step {cfg.step_ms:g} ms"
    from deploy import tiny_model

    model_dir = tiny_model.build_tiny_model(GPU_MODEL_KIND)
    params = tiny_model.parameter_count(model_dir)
    return (
        f"the reference engine on {gpu_name() or 'a GPU'} (torch, bfloat16, a random Llama-style model of "
        f"{params / 1e6:.0f}M parameters, batched decode; eager PyTorch behind Triton's Python backend, not "
        f"TensorRT-LLM), cells judged against a {cfg.step_ms:g} ms step"
    )


def loadgen_capacity(cfg: HostConfig, plan: CpuPlan | None) -> float:
    """The cores the load generator can use: one per process (each is one event loop), no more than
    its cpus."""
    return float(min(cfg.load_processes, len(plan.loadgen) if plan else os.cpu_count() or 1))


def write_report(
    out: Path, cfg: HostConfig, cells: Sequence[Cell], plan: CpuPlan | None = None, layout: str = ""
) -> str:
    table = rows(cells, cfg, loadgen_capacity(cfg, plan))
    fixed = [r for r in table if not r["per_worker"]]
    matched = [r for r in table if r["per_worker"]]
    info = machine()
    engine = engine_description(cfg)
    text = "\n".join(
        [
            f"# make bench-host{f' ({cfg.label})' if cfg.label else ''}: {info['date_utc']} on "
            f"{info['host']} ({info['cores']} cores, "
            f"{info.get('cpu', '?')}, {info.get('memory_gib', '?')} GiB, Python {info['python']})",
            "",
            f"Engine: {engine}, {cfg.engine_instances} instance(s) x "
            f"{cfg.triton_replicas} Triton(s); {cfg.max_tokens} output tokens, {cfg.prompt_tokens}-token "
            f"prompts; engine route; {cfg.load_processes} load process(es); {cfg.repeats} round(s), "
            f"medians; a cell is Triton-bound when TPOT p50 > {cfg.bound_factor:g} x the step and no "
            f"worker is saturated (>= {SATURATED_CORES} cores), gateway-bound when one is, "
            f"load-generator-bound (before either) when the load generator used >= "
            f"{LOADGEN_SATURATED:g} x the {loadgen_capacity(cfg, plan):g} cores it can use; Triton-bound "
            "and load-generator-bound cells are not counted.",
            "",
            f"Gateway to Triton over {'HTTP generate_stream' if cfg.transport == 'http' else 'gRPC'}; the "
            f"load generator opens {CONNECTION_LABELS[cfg.connections]} with "
            f"{'loadtest.lean_http on uvloop' if cfg.load_client == 'lean' else 'aiohttp'}; "
            f"placement: {layout or 'not recorded'}; "
            + (
                f"net.core.wmem_default raised to {cfg.triton_send_buffer} while Triton starts "
                "(where root; below it Triton's HTTP frontend loses stream responses: "
                "loadtest.triton_http_drops)"
                if cfg.triton_send_buffer
                else "net.core.wmem_default left as the host has it"
            )
            + ". conns/worker: the client connections each "
            "worker held over the window (mean of samples every 0.5 s).",
            "",
            "## The scaling cells (total concurrency)",
            "",
            markdown_table(fixed, cfg),
            "",
            "Against the scaling targets (CPU per token 1 -> 8 workers <= 1.2x; >= 0.8x linear):",
            "",
            *verdicts(table, cfg),
            "",
            *(
                [
                    "## Matched load per worker (an added view, not the scaling targets)",
                    "",
                    "Each worker carries the same number of streams, so CPU per token is compared at "
                    "equal load per worker (total concurrency = streams per worker x workers).",
                    "",
                    markdown_table(matched, cfg),
                    "",
                    *matched_lines(table, cfg),
                    "",
                ]
                if matched
                else []
            ),
            "## What the host can carry",
            "",
            *capacity_lines(cells, cfg, plan),
            "",
        ]
    )
    (out / "bench_host.md").write_text(text)
    (out / "bench_host.json").write_text(
        json.dumps(
            {
                "machine": info,
                "config": asdict(cfg),
                "placement": {"layout": layout, **(asdict(plan) if plan else {})},
                "rows": table,
                "cells": [
                    {**{k: v for k, v in asdict(c).items() if k != "summary"}, "summary": c.summary.flat()}
                    for c in cells
                ],
            },
            indent=1,
            default=str,
        )
    )
    import csv

    with (out / "bench_host.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["api"])
        writer.writeheader()
        writer.writerows(table)
    with contextlib.suppress(Exception):
        plot(out / "bench_host.png", table, cfg)
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_host", description=__doc__)
    p.add_argument("--small", action="store_true", help="the 2-core variant: workers 1,2, c=16,64, 1 round")
    p.add_argument("--workers", help="comma list (default 1,2,4,8)")
    p.add_argument("--concurrency", help="comma list (default 64,256)")
    p.add_argument("--apis", help=f"comma list of {','.join(API_LABELS)} (default: all)")
    p.add_argument("--repeat", type=int, help="rounds (default 3)")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="synthetic (fixed step, no model, the Python backend; the default), native (the same tokens "
        "from a Triton backend in C: engines/native/) or gpu: the reference engine with torch on the GPU "
        "and a random model of a few hundred M parameters",
    )
    p.add_argument(
        "--engine-instances",
        type=int,
        help=f"engine instances per Triton (default 12 synthetic and native, {GPU_ENGINE_INSTANCES} gpu)",
    )
    p.add_argument("--triton-replicas", type=int, help="tritonserver processes (default 1)")
    p.add_argument("--load-processes", type=int, help="load generator processes (default 6)")
    p.add_argument("--step-ms", type=float)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--level-duration", type=float, help="seconds per cell")
    p.add_argument(
        "--per-worker-concurrency",
        help="comma list of streams per worker for the matched-load view (default 4,8; 0: none)",
    )
    p.add_argument(
        "--transport",
        choices=("http", "grpc"),
        help="the gateway's Triton hot path: HTTP generate_stream (default) or gRPC",
    )
    p.add_argument(
        "--connections",
        choices=("fresh", "keep-alive"),
        help="the load generator: a new connection per request (default: many clients) or keep-alive",
    )
    p.add_argument(
        "--load-client",
        choices=("lean", "aiohttp"),
        help="the load generator's HTTP client: lean_http on uvloop (default) or aiohttp (earlier runs)",
    )
    p.add_argument(
        "--triton-send-buffer",
        type=int,
        help="net.core.wmem_default in bytes while Triton starts (root only; default 32 MiB; 0: leave it)",
    )
    p.add_argument(
        "--placement",
        choices=("auto", "off"),
        help="pin workers, Triton and the load generator to disjoint cpus (default auto) or not",
    )
    p.add_argument(
        "--loadgen-cpus",
        type=int,
        help="cpus for the load generator (default: 3 per 8 workers of the most run, at least an eighth)",
    )
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra flag for `gateway serve` (repeatable)"
    )
    p.add_argument("--label", help="what this run is, for the report's title")
    p.add_argument("--out", help="results directory (default results/host-<timestamp>)")
    return p


def config_from_args(args: argparse.Namespace) -> HostConfig:
    cfg = HostConfig.small() if args.small else HostConfig()
    changes: dict[str, Any] = {}
    for name in ("workers", "concurrency"):
        if getattr(args, name):
            key = "workers" if name == "workers" else "concurrencies"
            changes[key] = tuple(sorted(int(x) for x in getattr(args, name).split(",")))
    if args.apis:
        apis = tuple(a.strip() for a in args.apis.split(","))
        unknown = set(apis) - set(API_LABELS)
        if unknown:
            raise SystemExit(f"unknown APIs: {', '.join(sorted(unknown))}")
        changes["apis"] = apis
    for name, attr in (
        ("repeat", "repeats"),
        ("engine_instances", "engine_instances"),
        ("triton_replicas", "triton_replicas"),
        ("load_processes", "load_processes"),
        ("step_ms", "step_ms"),
        ("max_tokens", "max_tokens"),
        ("level_duration", "level_duration_s"),
        ("out", "out_dir"),
        ("transport", "transport"),
        ("connections", "connections"),
        ("load_client", "load_client"),
        ("triton_send_buffer", "triton_send_buffer"),
        ("placement", "placement"),
        ("loadgen_cpus", "loadgen_cpus"),
    ):
        if getattr(args, name) is not None:
            changes[attr] = getattr(args, name)
    if args.per_worker_concurrency is not None:
        changes["per_worker_concurrencies"] = tuple(
            sorted({int(x) for x in args.per_worker_concurrency.split(",") if x.strip() and int(x) > 0})
        )
    if args.engine == "gpu":
        changes["engine_mode"] = "gpu"
        changes.setdefault("engine_instances", GPU_ENGINE_INSTANCES)
    elif args.engine == "native":
        changes["engine_mode"] = "native"
    if args.gateway_arg:
        changes["gateway_extra_args"] = split_args(args.gateway_arg)
    if args.label:
        changes["label"] = args.label
    return replace(cfg, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    bench_setup()
    cfg = config_from_args(build_parser().parse_args(argv))
    out = Path(cfg.out_dir or f"results/host-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, interrupt)
    plan, layout = cpu_plan(cfg)
    log.info("placement: %s", layout)
    try:
        run_host_bench(cfg, out, cells, plan)
    except Interrupted as exc:
        log.warning("interrupted (%s): reporting the %d cells measured", exc, len(cells))
    sys.stdout.write(write_report(out, cfg, cells, plan, layout) + "\n")
    log.info("results in %s/", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
