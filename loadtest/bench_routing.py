"""`python -m loadtest.bench_routing` (`make bench-routing`): the gateway's routing policies over
several Triton replicas, on workloads that share prompt prefixes and on one that does not.

Starts `--replicas` (4) CPU Tritons serving the engine model in `synthetic` mode: tokens at a
fixed step, a context phase that sleeps a fixed time per uncached prompt token, KV-cache reuse on,
and a block budget that holds a few of the workload's documents but not all of them. Prefill is
paid only for what a replica does not hold, so the benchmark measures routing, not this machine's
CPU. One gateway per policy (`round_robin`, `least_outstanding`, `prefix`) is given every replica.

Workloads (chat completions, streamed, closed loop of `--users` concurrent users):
  shared   several long documents (system prompts) shared by many users, each a multi-turn
           conversation whose prompt grows by the previous answer and a new question;
  control  every request a fresh document of the same length: nothing to share;
  skewed   as shared, but the documents' popularity is Zipf-like (one takes about half the load).
In each round every workload is sent through every policy, in a rotated order, so the figures
compared are taken a minute apart on this shared machine. Each (workload, policy, round) gets its
own salt at the very start of every prompt: the same request stream, with nothing left in any
cache (gateway index or engine) from the runs before it.

Reported per (workload, policy), median over rounds: TTFT p50/p99, output tokens/s, the hit rate
the engines report (cached prompt tokens from their `kv_cache_reused_blocks` over prompt tokens),
and the load spread (requests each replica served, from Triton's own counters; max over mean).
A single replica holding four replicas' blocks runs the shared and skewed workloads at the end:
the hit rate no routing can beat. Writes results/routing-<timestamp>/ (markdown, JSON, CSV, plot).

More scenarios (the priority scenario of issue 20) plug in through `SCENARIOS`: a name and an
async function given the running replicas and gateways (`BenchContext`) that returns a report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import math
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loadtest.fastjson import dumps
from loadtest.report import write_csv, write_report
from loadtest.sse import DONE, SSEParser, loads
from loadtest.stats import Distribution
from loadtest.subproc import (
    NotReady,
    bench_setup,
    free_port,
    given_args,
    results_dir,
    spawn_logged,
    split_args,
    stop_process,
    wait_http_ready,
)
from loadtest.target import detail, error_kind, http_session, server_message
from loadtest.workload import _WORDS

log = logging.getLogger(__name__)

POLICIES = ("round_robin", "least_outstanding", "prefix")
WORKLOADS = ("shared", "control", "skewed")
ENGINE = "tensorrt_llm"
SERVED = "tiny"


@dataclass(frozen=True, slots=True)
class RoutingBenchConfig:
    replicas: int = 4
    policies: tuple[str, ...] = POLICIES
    workloads: tuple[str, ...] = WORKLOADS
    rounds: int = 3
    users: int = 24  # concurrent conversations (closed loop)
    requests: int = 192  # per (workload, policy, round)
    # 16 documents of about 1,100 tokens (with a conversation's turns): a replica's KV cache holds
    # about 5 of them, so a router that sends every document everywhere keeps evicting them, while
    # 4 per replica fit beside the running sequences (and one replica with 4x the blocks holds all).
    documents: int = 16
    document_words: int = 900  # about 1,000 tokens with the system turn's template
    question_words: int = 24
    turns: int = 3  # per conversation, each prompt holding the ones before
    zipf_s: float = 1.5  # skewed workload: document i's weight is 1 / (i + 1) ** s
    max_tokens: int = 16
    step_ms: float = 20.0  # decoding step: one token per running sequence
    prefill_ms_per_token: float = 0.25  # context phase, per prompt token not reused from the cache
    tokens_per_block: int = 16
    # Per replica: a few documents' blocks beside the running sequences', not all of them.
    kv_cache_tokens: int = 6144
    baseline: bool = True  # also run one replica with every replica's blocks (hit-rate reference)
    scenarios: tuple[str, ...] = ("priority",)  # from SCENARIOS, after the routing rounds
    out_dir: str = ""
    seed: int = 20
    gateway_args: tuple[str, ...] = ()  # extra `gateway serve` flags, for every gateway

    @classmethod
    def quick(cls) -> RoutingBenchConfig:
        return cls(rounds=1, requests=48, users=12, documents=6, document_words=500, kv_cache_tokens=3072)


# ------------------------------------------------------------------------------------------ workload


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(count))


@dataclass(frozen=True, slots=True)
class Conversation:
    """A user's conversation: a system document, then questions asked one after the other."""

    user: str
    document: str
    questions: tuple[str, ...]


def conversations(cfg: RoutingBenchConfig, workload: str, slot: int, salt: str) -> Iterator[Conversation]:
    """User slot `slot`'s endless sequence of conversations, the same for every policy and round
    but for `salt`, which starts every prompt (so no run finds another run's blocks cached)."""
    doc_rng = random.Random(f"{cfg.seed}-documents")
    documents = [_words(doc_rng, cfg.document_words) for _ in range(cfg.documents)]
    weights = [1.0 / (i + 1) ** cfg.zipf_s for i in range(cfg.documents)]
    rng = random.Random(f"{cfg.seed}-{workload}-{slot}")
    number = 0
    while True:
        number += 1
        user = f"{salt}-u{slot}-{number}"
        if workload == "control":
            # A document of its own (same length), asked one question: nothing shared.
            yield Conversation(
                user, f"{salt} {_words(rng, cfg.document_words)}", (_words(rng, cfg.question_words),)
            )
            continue
        if workload == "skewed":
            index = rng.choices(range(cfg.documents), weights=weights)[0]
        else:
            index = rng.randrange(cfg.documents)
        questions = tuple(_words(rng, cfg.question_words) for _ in range(cfg.turns))
        yield Conversation(user, f"{salt} {documents[index]}", questions)


def run_salt(workload: str, policy: str, round_no: int) -> str:
    """A few words, distinct per run, that start every prompt of that run."""
    digest = hashlib.blake2b(f"{workload}/{policy}/{round_no}".encode(), digest_size=8).digest()
    rng = random.Random(digest)
    return "run " + _words(rng, 6)


# -------------------------------------------------------------------------------------------- client


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request: when it started, its first text, its end; the usage the gateway reported."""

    start: float
    end: float
    first: float | None
    text: str = ""
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    error: str | None = None
    error_detail: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start


async def chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Outcome:
    """One streamed chat completion; never raises (a failure is the outcome's error)."""
    start = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    error = error_msg = None
    try:
        async with session.post(url, data=dumps(body), headers={"content-type": "application/json"}) as resp:
            if resp.status != 200:
                error, error_msg = f"http_{resp.status}", detail(server_message(await resp.read()))
            else:
                parser = SSEParser()
                done = False
                async for raw in resp.content.iter_any():
                    now = time.perf_counter()
                    for event in parser.feed(raw):
                        if event.data == DONE:
                            done = True
                            continue
                        obj: Any = loads(event.data)
                        if "error" in obj:
                            error, error_msg = "stream_error", detail(obj["error"])
                            continue
                        for choice in obj.get("choices") or ():
                            text = (choice.get("delta") or {}).get("content")
                            if text:
                                first = now if first is None else first
                                pieces.append(text)
                        if obj.get("usage"):
                            usage = obj["usage"]
                if not done and error is None:
                    error, error_msg = "incomplete_stream", "the stream ended without data: [DONE]"
    except Exception as exc:  # every failure is counted, never an aborted run
        error, error_msg = error_kind(exc), detail(repr(exc))
    details = usage.get("prompt_tokens_details") or {}
    return Outcome(
        start=start,
        end=time.perf_counter(),
        first=first,
        text="".join(pieces),
        output_tokens=int(usage.get("completion_tokens") or 0),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=details.get("cached_tokens"),
        error=error,
        error_detail=error_msg,
    )


async def drive(
    base_url: str,
    cfg: RoutingBenchConfig,
    workload: str,
    salt: str,
    on_done: Callable[[Outcome], None] | None = None,
) -> tuple[list[Outcome], float]:
    """`cfg.users` users, each going through its conversations turn by turn, until `cfg.requests`
    requests have been sent. Returns the outcomes and the wall time."""
    url = base_url + "/v1/chat/completions"
    budget = iter(range(cfg.requests))
    outcomes: list[Outcome] = []

    async def user(slot: int, session: aiohttp.ClientSession) -> None:
        for convo in conversations(cfg, workload, slot, salt):
            messages: list[dict[str, str]] = [{"role": "system", "content": convo.document}]
            for question in convo.questions:
                if next(budget, None) is None:
                    return
                messages.append({"role": "user", "content": question})
                body = {
                    "model": SERVED,
                    "messages": messages,
                    "max_tokens": cfg.max_tokens,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    # As clients identify their end users; policies other than prefix ignore it.
                    "user": convo.user,
                }
                outcome = await chat(session, url, body)
                outcomes.append(outcome)
                if on_done is not None:
                    on_done(outcome)
                if outcome.error is not None:
                    break
                messages.append({"role": "assistant", "content": outcome.text})

    async with http_session(cfg.users, 300.0) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(user(slot, session) for slot in range(cfg.users)))
        return outcomes, time.perf_counter() - t0


# --------------------------------------------------------------------------------------------- stack

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m["name"] != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m["value"])
    return total


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    requests: float  # requests the engine model served (Triton's nv_inference_request_success)
    reused_blocks: float  # KV blocks the engine reused, all time (nv_trt_llm_kv_cache_block_metrics)


@dataclass
class Replica:
    server: Any  # deploy.devstack.TritonServer

    @property
    def grpc_url(self) -> str:
        return str(self.server.grpc_url)

    def counters(self) -> ReplicaCounters:
        text = self.server.metrics_text()
        return ReplicaCounters(
            requests=metric(text, "nv_inference_request_success", model=ENGINE),
            reused_blocks=metric(
                text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused", model=ENGINE
            ),
        )


@dataclass
class BenchContext:
    """What a scenario gets: the configuration, the replicas, and a gateway URL per policy."""

    cfg: RoutingBenchConfig
    replicas: list[Replica]
    gateways: dict[str, str]
    tokenizer_dir: Path
    workdir: Path

    def gateway(self, policy: str, *extra: str) -> contextlib.AbstractContextManager[str]:
        """One more gateway over the same replicas (say, with a tight admission limit); its URL."""
        urls = [r.grpc_url for r in self.replicas]
        log_path = self.workdir / f"gateway-{policy}-{len(extra)}.log"
        return gateway(policy, urls, self.tokenizer_dir, log_path, extra)


Scenario = Callable[[BenchContext], Awaitable[dict[str, Any]]]


async def priority_scenario(context: BenchContext) -> dict[str, Any]:
    """Issue 20's priority targets over the same replicas: `loadtest.priority`'s two-class overload
    through a `prefix` gateway whose admission limit it overloads."""
    from loadtest.priority import PriorityConfig, run_priority
    from loadtest.priority import markdown as priority_markdown
    from loadtest.workload import synthetic_prompts

    # Admission for the replicas' capacity: with these engines (20 ms steps, not the standalone
    # run's 5) 4 slots could not even serve the high-priority arrivals, so every class queued.
    cfg = replace(PriorityConfig(), max_concurrent=4 * len(context.replicas))
    extra = [
        "--max-concurrent-requests",
        str(cfg.max_concurrent),
        "--max-queued-requests",
        str(cfg.max_queued),
    ]
    extra += ["--queue-timeout-s", str(cfg.queue_timeout_s), "--no-access-log"]
    prompts = synthetic_prompts(256, cfg.prompt_tokens, seed=cfg.seed, tokenizer_dir=context.tokenizer_dir)
    with context.gateway("prefix", *extra) as base:
        result = await run_priority(base + "/v1", SERVED, prompts, cfg)
    checks = result.checks()
    return {
        "markdown": priority_markdown(result),
        "met": all(ok for ok, _ in checks),
        "checks": [{"met": ok, "figures": text} for ok, text in checks],
        "ttft_ratio": result.ttft_ratio,
    }


# Further scenarios run after the routing rounds on the same replicas (`--scenarios`); each returns
# a JSON-able report with a "markdown" entry for the report file.
SCENARIOS: dict[str, Scenario] = {"priority": priority_scenario}


def render_engine_repository(
    cfg: RoutingBenchConfig, workdir: Path, kv_cache_tokens: int, name: str
) -> tuple[Path, Path]:
    """A CPU repository with only the engine model (the gateway's engine route needs no more):
    synthetic tokens, prefill time per uncached token, KV-cache reuse within `kv_cache_tokens`."""
    import shutil

    from deploy import devstack

    repo = devstack.prepare_dev_repository(
        workdir / name,
        engine_mode="synthetic",
        variables={
            "synthetic_step_ms": cfg.step_ms,
            "synthetic_prefill_ms_per_token": cfg.prefill_ms_per_token,
            "tokens_per_block": cfg.tokens_per_block,
            "max_tokens_in_paged_kv_cache": kv_cache_tokens,
            "enable_kv_cache_reuse": True,
        },
    )
    for child in repo.path.iterdir():
        if child.is_dir() and child.name != ENGINE:
            shutil.rmtree(child)
    return repo.path, repo.model_dir


@contextlib.contextmanager
def replicas(paths: Sequence[Path], workdir: Path) -> Iterator[list[Replica]]:
    from deploy import devstack

    with contextlib.ExitStack() as stack:
        servers = []
        for i, path in enumerate(paths):
            server = devstack.TritonServer([path], work_dir=workdir / f"triton-{i}")
            stack.callback(server.stop)
            server.start()
            servers.append(server)
        for server in servers:
            server.wait_ready(300.0)
        yield [Replica(s) for s in servers]


@contextlib.contextmanager
def gateway(
    policy: str, grpc_urls: Sequence[str], tokenizer_dir: Path, log_path: Path, extra: Sequence[str] = ()
) -> Iterator[str]:
    port = free_port()
    spec = f"name={SERVED},tokenizer={tokenizer_dir},route=engine,triton_model={ENGINE},engine_model={ENGINE}"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    for url in grpc_urls:
        cmd += ["--triton-url", url]
    cmd += ["--model", spec, "--routing-policy", policy, "--log-level", "warning"]
    # Room for every user: the gateway's own admission limit is not what is measured.
    cmd += ["--max-concurrent-requests", "1024", *extra]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = spawn_logged(cmd, log_path, env)
    try:
        wait_http_ready(proc, f"http://127.0.0.1:{port}/health/ready", 180.0, log_path)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


# ------------------------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class RunResult:
    workload: str
    policy: str
    round: int
    requests: int
    errors: dict[str, int]
    error_details: dict[str, str]
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: dict[str, float]
    per_replica_requests: tuple[float, ...]
    per_replica_reused_blocks: tuple[float, ...]

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else math.nan

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else math.nan

    @property
    def load_ratio(self) -> float:
        """The busiest replica's requests over the mean."""
        counts = self.per_replica_requests
        mean = sum(counts) / len(counts) if counts else 0.0
        return max(counts) / mean if mean else math.nan


async def measure(
    base_url: str,
    replicas_: Sequence[Replica],
    cfg: RoutingBenchConfig,
    workload: str,
    policy: str,
    round_no: int,
    progress: Progress | None,
) -> RunResult:
    salt = run_salt(workload, policy, round_no)
    task = None
    if progress is not None:
        task = progress.add_task(f"r{round_no} {workload:<8} {policy:<18}", total=cfg.requests)

    def advance(outcome: Outcome) -> None:
        if progress is not None and task is not None:
            progress.advance(task)

    before = [await asyncio.to_thread(r.counters) for r in replicas_]
    outcomes, duration = await drive(base_url, cfg, workload, salt, advance)
    after = [await asyncio.to_thread(r.counters) for r in replicas_]
    if progress is not None and task is not None:
        progress.remove_task(task)
    ok = [o for o in outcomes if o.error is None]
    errors: dict[str, int] = {}
    details: dict[str, str] = {}
    for o in outcomes:
        if o.error is not None:
            errors[o.error] = errors.get(o.error, 0) + 1
            details.setdefault(o.error, o.error_detail or "")
    ttft = Distribution.of(t for o in ok if (t := o.ttft) is not None)
    result = RunResult(
        workload=workload,
        policy=policy,
        round=round_no,
        requests=len(outcomes),
        errors=errors,
        error_details=details,
        duration_s=duration,
        output_tokens=sum(o.output_tokens for o in ok),
        prompt_tokens=sum(o.prompt_tokens for o in ok),
        cached_tokens=sum(o.cached_tokens or 0 for o in ok),
        ttft_ms={
            "p50": ttft.p50 * 1000,
            "p90": ttft.p90 * 1000,
            "p99": ttft.p99 * 1000,
            "mean": ttft.mean * 1000,
        },
        per_replica_requests=tuple(a.requests - b.requests for a, b in zip(after, before, strict=True)),
        per_replica_reused_blocks=tuple(
            a.reused_blocks - b.reused_blocks for a, b in zip(after, before, strict=True)
        ),
    )
    log.info(
        "r%d %-8s %-18s TTFT p50 %7.1f ms p99 %7.1f ms  %6.0f tok/s  hit %5.1f%%  "
        "load max/mean %.2f  errors %d",
        round_no,
        workload,
        policy,
        result.ttft_ms["p50"],
        result.ttft_ms["p99"],
        result.output_tokens_per_s,
        result.hit_rate * 100,
        result.load_ratio,
        sum(errors.values()),
    )
    return result


def rotated(items: Sequence[str], by: int) -> list[str]:
    """`items` starting at position `by`: each round runs the policies in another order."""
    k = by % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


async def run_bench(cfg: RoutingBenchConfig, out: Path, console: Console) -> dict[str, Any]:
    workdir = out / "work"
    path, tokenizer_dir = render_engine_repository(cfg, workdir, cfg.kv_cache_tokens, "model_repo")
    results: list[RunResult] = []
    baseline: list[RunResult] = []
    scenarios: dict[str, Any] = {}
    total = cfg.rounds * len(cfg.workloads) * len(cfg.policies)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        refresh_per_second=4,
    )
    with progress:
        overall = progress.add_task("routing runs", total=total + (2 if cfg.baseline else 0))
        progress.console.log(f"starting {cfg.replicas} Triton replicas")
        with replicas([path] * cfg.replicas, workdir) as reps, contextlib.ExitStack() as gateways:
            urls = [r.grpc_url for r in reps]
            bases = {
                p: gateways.enter_context(
                    gateway(p, urls, tokenizer_dir, workdir / f"gateway-{p}.log", cfg.gateway_args)
                )
                for p in cfg.policies
            }
            for round_no in range(1, cfg.rounds + 1):
                for w_index, workload in enumerate(cfg.workloads):
                    for policy in rotated(cfg.policies, round_no - 1 + w_index):
                        results.append(
                            await measure(bases[policy], reps, cfg, workload, policy, round_no, progress)
                        )
                        progress.advance(overall)
            context = BenchContext(cfg, reps, bases, tokenizer_dir, workdir)
            for name in cfg.scenarios:
                progress.console.log(f"scenario {name}")
                try:
                    scenarios[name] = await SCENARIOS[name](context)
                except Exception as exc:  # the routing figures are still reported
                    log.exception("scenario %s failed", name)
                    scenarios[name] = {"markdown": f"did not run: {type(exc).__name__}: {exc}", "met": False}
        if cfg.baseline:
            # One replica with every replica's blocks: the hit rate routing could at best reach.
            progress.console.log("baseline: one replica holding every replica's blocks")
            big, _ = render_engine_repository(
                cfg, workdir, cfg.kv_cache_tokens * cfg.replicas, "model_repo_single"
            )
            with (
                replicas([big], workdir / "single") as (rep,),
                gateway(
                    "least_outstanding", [rep.grpc_url], tokenizer_dir, workdir / "gateway-single.log"
                ) as base,
            ):
                for workload in ("shared", "skewed"):
                    if workload in cfg.workloads:
                        baseline.append(await measure(base, [rep], cfg, workload, "single", 1, progress))
                    progress.advance(overall)
    return {"results": results, "baseline": baseline, "scenarios": scenarios}


# ------------------------------------------------------------------------------------------ reporting


def _median(xs: Sequence[float]) -> float:
    vals = [x for x in xs if not math.isnan(x)]
    return float(statistics.median(vals)) if vals else math.nan


def _spread(xs: Sequence[float]) -> float:
    vals = [x for x in xs if not math.isnan(x)]
    return max(vals) - min(vals) if vals else math.nan


def summary_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per (workload, policy): medians over the rounds, with the TTFT p50 range."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.workload, r.policy), []).append(r)
    rows = []
    for (workload, policy), runs in groups.items():
        shares = [
            sum(r.per_replica_requests[i] for r in runs) for i in range(len(runs[0].per_replica_requests))
        ]
        total = sum(shares)
        rows.append(
            {
                "workload": workload,
                "policy": policy,
                "rounds": len(runs),
                "requests": sum(r.requests for r in runs),
                "errors": sum(sum(r.errors.values()) for r in runs),
                "ttft_p50_ms": _median([r.ttft_ms["p50"] for r in runs]),
                "ttft_p50_ms_min": min(r.ttft_ms["p50"] for r in runs),
                "ttft_p50_ms_max": max(r.ttft_ms["p50"] for r in runs),
                "ttft_p99_ms": _median([r.ttft_ms["p99"] for r in runs]),
                "output_tokens_per_s": _median([r.output_tokens_per_s for r in runs]),
                "hit_rate": _median([r.hit_rate for r in runs]),
                "load_ratio": _median([r.load_ratio for r in runs]),
                "load_ratio_max": max(r.load_ratio for r in runs),
                "request_shares": [s / total if total else math.nan for s in shares],
            }
        )
    return rows


def _row(rows: Sequence[dict[str, Any]], workload: str, policy: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["workload"] == workload and r["policy"] == policy), None)


def verdicts(
    rows: Sequence[dict[str, Any]], results: Sequence[RunResult], baseline: Sequence[RunResult]
) -> list[dict[str, Any]]:
    """The issue's targets, each met or not, with the figures that decide it."""
    out: list[dict[str, Any]] = []
    prefix, lo = _row(rows, "shared", "prefix"), _row(rows, "shared", "least_outstanding")
    if prefix and lo:
        ratio = lo["ttft_p50_ms"] / prefix["ttft_p50_ms"] if prefix["ttft_p50_ms"] else math.nan
        tput = (
            prefix["output_tokens_per_s"] / lo["output_tokens_per_s"]
            if lo["output_tokens_per_s"]
            else math.nan
        )
        out.append(
            {
                "target": "shared: prefix TTFT p50 >= 2x lower than least_outstanding, "
                "at equal or higher throughput",
                "met": ratio >= 2.0 and tput >= 1.0,
                "figures": f"{ratio:.2f}x lower TTFT p50 ({prefix['ttft_p50_ms']:.0f} vs "
                f"{lo['ttft_p50_ms']:.0f} ms); throughput {tput:.2f}x "
                f"({prefix['output_tokens_per_s']:.0f} vs {lo['output_tokens_per_s']:.0f} tok/s)",
            }
        )
    single = next((b for b in baseline if b.workload == "shared"), None)
    if prefix and single is not None:
        share = prefix["hit_rate"] / single.hit_rate if single.hit_rate else math.nan
        out.append(
            {
                "target": "shared: prefix hit rate >= 80% of one replica holding all the blocks",
                "met": share >= 0.8,
                "figures": f"{prefix['hit_rate'] * 100:.1f}% vs {single.hit_rate * 100:.1f}% "
                f"({share * 100:.0f}%)",
            }
        )
    cp, cl = _row(rows, "control", "prefix"), _row(rows, "control", "least_outstanding")
    if cp and cl:
        spread = max(
            _spread([r.ttft_ms["p50"] for r in results if r.workload == "control" and r.policy == p])
            for p in ("prefix", "least_outstanding")
        )
        diff = cp["ttft_p50_ms"] - cl["ttft_p50_ms"]
        tput = (
            cp["output_tokens_per_s"] / cl["output_tokens_per_s"] if cl["output_tokens_per_s"] else math.nan
        )
        out.append(
            {
                "target": "control: prefix no worse than least_outstanding beyond the run-to-run spread",
                "met": diff <= spread if not math.isnan(spread) else diff <= 0,
                "figures": f"TTFT p50 {cp['ttft_p50_ms']:.0f} vs {cl['ttft_p50_ms']:.0f} ms ({diff:+.0f} ms; "
                f"spread over rounds {spread:.0f} ms); throughput {tput:.2f}x",
            }
        )
    sk = _row(rows, "skewed", "prefix")
    if sk:
        out.append(
            {
                "target": "skewed: no endpoint above 1.5x the mean load (prefix)",
                "met": sk["load_ratio_max"] <= 1.5,
                "figures": f"busiest replica {sk['load_ratio']:.2f}x the mean (median), "
                f"{sk['load_ratio_max']:.2f}x (worst round); shares "
                f"{', '.join(f'{s * 100:.0f}%' for s in sk['request_shares'])}",
            }
        )
    return out


def markdown(cfg: RoutingBenchConfig, report: Mapping[str, Any], started: str) -> str:
    rows = report["rows"]
    lines = [
        f"Routing benchmark, {started}, {platform.node() or 'host'}: {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}. {cfg.replicas} CPU Triton replicas (synthetic engine: "
        f"{cfg.step_ms:g} ms step, {cfg.prefill_ms_per_token:g} ms per uncached prompt token, "
        f"{cfg.tokens_per_block} tokens per block, {cfg.kv_cache_tokens} tokens of KV cache each); "
        f"{cfg.users} concurrent users, {cfg.requests} requests per run, {cfg.max_tokens} output tokens, "
        f"{cfg.documents} documents of {cfg.document_words} words, {cfg.turns} turns; "
        f"{cfg.rounds} round(s), medians.",
        "",
        "| workload | policy | ok/req | TTFT p50 ms (range) | TTFT p99 ms | out tok/s | hit rate | "
        "busiest/mean | requests per replica |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['policy']} | {r['requests'] - r['errors']}/{r['requests']} | "
            f"{r['ttft_p50_ms']:.0f} ({r['ttft_p50_ms_min']:.0f}-{r['ttft_p50_ms_max']:.0f}) | "
            f"{r['ttft_p99_ms']:.0f} | "
            f"{r['output_tokens_per_s']:.0f} | {r['hit_rate'] * 100:.1f}% | {r['load_ratio']:.2f}x | "
            f"{' / '.join(f'{s * 100:.0f}%' for s in r['request_shares'])} |"
        )
    for b in report["baseline"]:
        lines.append(
            f"| {b.workload} | one replica, all blocks | "
            f"{b.requests - sum(b.errors.values())}/{b.requests} | "
            f"{b.ttft_ms['p50']:.0f} | {b.ttft_ms['p99']:.0f} | {b.output_tokens_per_s:.0f} | "
            f"{b.hit_rate * 100:.1f}% | - | - |"
        )
    lines += ["", "| target | met | figures |", "|---|---|---|"]
    for v in report["verdicts"]:
        lines.append(f"| {v['target']} | {'met' if v['met'] else '**not met**'} | {v['figures']} |")
    for name, scenario in report["scenarios"].items():
        for check in scenario.get("checks", ()):
            met = "met" if check["met"] else "**not met**"
            lines.append(f"| {name}: {check['figures'].split(':')[0]} | {met} | {check['figures']} |")
    errors = {k: v for r in report["results"] for k, v in r.error_details.items()}
    if errors:
        lines += ["", "Errors: " + "; ".join(f"{k}: {v}" for k, v in errors.items())]
    for name, scenario in report["scenarios"].items():
        lines += ["", f"### {name}", "", str(scenario.get("markdown", ""))]
    return "\n".join(lines)


def plot(path: Path, rows: Sequence[dict[str, Any]], policies: Sequence[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    panels = (
        ("ttft_p50_ms", "TTFT p50 (ms)"),
        ("ttft_p99_ms", "TTFT p99 (ms)"),
        ("output_tokens_per_s", "output tokens/s"),
        ("hit_rate", "KV cache hit rate"),
    )
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(20, 4.5))
    width = 0.8 / max(len(policies), 1)
    for ax, (key, label) in zip(axes, panels, strict=False):
        for i, policy in enumerate(policies):
            ys = [(_row(rows, w, policy) or {}).get(key, math.nan) for w in workloads]
            ax.bar([x + i * width for x in range(len(workloads))], ys, width, label=policy)
        ax.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(workloads))], workloads)
        ax.set_title(label)
        ax.grid(True, axis="y", alpha=0.3)
    ax = axes[-1]
    for i, policy in enumerate(policies):
        row = _row(rows, "skewed", policy) or _row(rows, workloads[0], policy)
        if row:
            shares = row["request_shares"]
            ax.bar(
                [x + i * width for x in range(len(shares))], [s * 100 for s in shares], width, label=policy
            )
    ax.set_title("requests per replica, skewed (%)")
    ax.set_xlabel("replica")
    ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, cfg: RoutingBenchConfig, raw: Mapping[str, Any], started: str) -> str:
    results: list[RunResult] = raw["results"]
    rows = summary_rows(results)
    report = {
        "rows": rows,
        "results": results,
        "baseline": raw["baseline"],
        "scenarios": raw["scenarios"],
        "verdicts": verdicts(rows, results, raw["baseline"]),
    }
    text = markdown(cfg, report, started)
    write_report(
        out,
        "bench_routing",
        text + "\n\n![routing](routing.png)\n",
        {
            "config": asdict(cfg),
            "started": started,
            "rows": rows,
            "verdicts": report["verdicts"],
            "runs": [asdict(r) for r in results],
            "baseline": [asdict(b) for b in raw["baseline"]],
            "scenarios": raw["scenarios"],
        },
    )
    write_csv(
        out / "bench_routing_runs.csv",
        (
            {
                "workload": r.workload,
                "policy": r.policy,
                "round": r.round,
                "requests": r.requests,
                "errors": sum(r.errors.values()),
                "ttft_p50_ms": round(r.ttft_ms["p50"], 2),
                "ttft_p99_ms": round(r.ttft_ms["p99"], 2),
                "output_tokens_per_s": round(r.output_tokens_per_s, 2),
                "hit_rate": round(r.hit_rate, 4),
                "load_ratio": round(r.load_ratio, 3),
                "per_replica_requests": " ".join(f"{x:g}" for x in r.per_replica_requests),
            }
            for r in [*results, *raw["baseline"]]
        ),
    )
    if rows:
        plot(out / "routing.png", rows, [p for p in cfg.policies])
    return text


# ---------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench_routing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round, fewer users and requests")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    p.add_argument("--replicas", type=int, help="Triton replicas (default 4)")
    p.add_argument("--users", type=int, help="concurrent users (default 24)")
    p.add_argument("--requests", type=int, help="requests per run (default 192)")
    p.add_argument("--policies", help=f"comma list of {', '.join(POLICIES)}")
    p.add_argument("--workloads", help=f"comma list of {', '.join(WORKLOADS)}")
    p.add_argument("--no-baseline", action="store_true", help="skip the one-replica hit-rate reference")
    p.add_argument(
        "--scenarios",
        help=f"comma list of {', '.join(SCENARIOS)} to run after the rounds (default all; '' none)",
    )
    p.add_argument("--documents", type=int, help="shared documents (default 16)")
    p.add_argument("--prefill-ms-per-token", type=float)
    p.add_argument("--kv-cache-tokens", type=int, help="KV cache tokens per replica")
    p.add_argument(
        "--gateway-arg", action="append", default=[], help="extra flag for every `gateway serve` (repeatable)"
    )
    p.add_argument("--out", help="results directory (default results/routing-<timestamp>)")
    return p


def config_from_args(args: argparse.Namespace) -> RoutingBenchConfig:
    cfg = RoutingBenchConfig.quick() if args.quick else RoutingBenchConfig()
    changes = given_args(
        args,
        "rounds",
        "replicas",
        "users",
        "requests",
        "documents",
        "prefill_ms_per_token",
        "kv_cache_tokens",
        out="out_dir",
    )
    for name, allowed in (("policies", POLICIES), ("workloads", WORKLOADS)):
        value = getattr(args, name)
        if value:
            chosen = tuple(v.strip() for v in value.split(","))
            unknown = set(chosen) - set(allowed)
            if unknown:
                raise SystemExit(f"unknown {name}: {', '.join(sorted(unknown))}")
            changes[name] = chosen
    if args.scenarios is not None:
        chosen = tuple(v.strip() for v in args.scenarios.split(",") if v.strip())
        unknown = set(chosen) - set(SCENARIOS)
        if unknown:
            raise SystemExit(f"unknown scenarios: {', '.join(sorted(unknown))}")
        changes["scenarios"] = chosen
    if args.gateway_arg:
        changes["gateway_args"] = split_args(args.gateway_arg)
    if args.no_baseline:
        changes["baseline"] = False
    return replace(cfg, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    bench_setup()
    cfg = config_from_args(build_parser().parse_args(argv))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = results_dir(cfg.out_dir, "routing")
    console = Console(stderr=True)
    try:
        raw = asyncio.run(run_bench(cfg, out, console))
    except NotReady as exc:
        log.error("a server did not start: %s", exc)
        return 1
    text = write(out, cfg, raw, started)
    sys.stdout.write(text + "\n")
    log.info("results in %s/", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
