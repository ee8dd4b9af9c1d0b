"""`python -m loadtest run ...`: parse flags, build the target and prompts, run, write results."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadtest.metrics import RequestRecord, RunSummary
from loadtest.openai_client import OpenAITarget
from loadtest.report import write_run
from loadtest.runner import LoadSpec, run_load
from loadtest.target import Target
from loadtest.workload import Prompt, Workload, load_dataset, synthetic_prompts

log = logging.getLogger(__name__)

_DEFAULT_URLS = {
    "openai": "http://127.0.0.1:9000/v1",
    "triton-grpc": "127.0.0.1:8001",
    "triton-http": "http://127.0.0.1:8000",
}


def _numbers(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> list[int] | list[float]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError("values must be positive")
        return values

    return parse


# Requests per load level when neither --requests nor --duration says otherwise.
DEFAULT_REQUESTS = 100
# Synthetic prompts made for a run (requests cycle through them).
_MAX_PROMPTS = 1000


def request_limit(requests: int | None, duration: float | None) -> int:
    """Requests per level: as given; else unbounded under --duration (which then ends the level);
    else the default."""
    if requests is not None:
        return requests
    return sys.maxsize if duration is not None else DEFAULT_REQUESTS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="drive load at one or more concurrencies or rates",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    t = run.add_argument_group("target")
    t.add_argument(
        "--target",
        choices=sorted(_DEFAULT_URLS),
        default="openai",
        help="openai: an OpenAI-compatible server; triton-grpc: Triton ModelStreamInfer; "
        "triton-http: Triton's /v2/models/<model>/generate_stream",
    )
    t.add_argument(
        "--base-url",
        help=f"openai: base URL with /v1 (default {_DEFAULT_URLS['openai']}); "
        f"triton-grpc: host:port (default {_DEFAULT_URLS['triton-grpc']}); "
        f"triton-http: server URL (default {_DEFAULT_URLS['triton-http']})",
    )
    t.add_argument("--model", required=True, help="served model name (OpenAI) or Triton model (ensemble)")
    t.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (openai)")
    t.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")

    w = run.add_argument_group("workload")
    w.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    w.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    w.add_argument("--max-tokens", type=int, default=128)
    w.add_argument(
        "--ignore-eos",
        action="store_true",
        help="fixed output lengths: ignore_eos extra body field (OpenAI), min_tokens=max_tokens (Triton)",
    )
    w.add_argument(
        "--usage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for stream_options.include_usage (token counts from usage, else content chunks)",
    )
    w.add_argument("--temperature", type=float)
    w.add_argument("--extra-body", type=json.loads, default={}, help="JSON object merged into each body")
    w.add_argument("--prompt-tokens", type=int, default=128, help="synthetic prompt length in tokens")
    w.add_argument("--tokenizer", help="tokenizer directory: synthetic prompts of exact token length")
    w.add_argument("--dataset", help="JSONL prompts (fields: see loadtest/workload.py) instead of synthetic")
    w.add_argument("--seed", type=int, default=0)

    load = run.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=_numbers(int), help="closed loop: comma list, e.g. 1,16,64")
    mode.add_argument("--rate", type=_numbers(float), help="open loop Poisson requests/s: comma list")
    load.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"requests per load level, an upper bound (none given: {DEFAULT_REQUESTS}, "
        "or no limit with --duration)",
    )
    load.add_argument("--duration", type=float, help="seconds per load level, an upper bound")
    load.add_argument("--warmup", type=int, default=0, help="requests sent first and not measured")

    out = run.add_argument_group("output")
    out.add_argument("--out", help="results directory (default results/loadtest-<timestamp>)")
    out.add_argument("--no-progress", action="store_true")
    return parser


def make_target(args: argparse.Namespace, workload: Workload) -> Target:
    url = args.base_url or _DEFAULT_URLS[args.target]
    if args.target == "openai":
        return OpenAITarget(url, args.model, workload, api_key=args.api_key, timeout=args.timeout)
    if args.target == "triton-grpc":
        from loadtest.triton_grpc import TritonGrpcTarget

        return TritonGrpcTarget(url, args.model, workload, timeout=args.timeout)
    from loadtest.triton_http import TritonHttpTarget

    return TritonHttpTarget(url, args.model, workload, timeout=args.timeout)


def make_prompts(args: argparse.Namespace, count: int) -> list[Prompt]:
    if args.dataset:
        return load_dataset(args.dataset)
    return synthetic_prompts(count, args.prompt_tokens, seed=args.seed, tokenizer_dir=args.tokenizer)


def summary_table(summaries: Sequence[RunSummary], title: str = "load test") -> Table:
    table = Table(title=title)
    for col in (
        "run",
        "ok/req",
        "errors",
        "out tok/s",
        "req/s",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "ITL p50",
        "TPOT p50",
        "TPOT p99",
        "E2E p50",
        "E2E p99",
    ):
        table.add_column(col, justify="left" if col in ("run", "errors") else "right")
    for s in summaries:
        table.add_row(
            s.label,
            f"{s.successes}/{s.requests}",
            ", ".join(f"{k}={v}" for k, v in sorted(s.errors.items())) or "0",
            f"{s.output_tokens_per_s:.1f}",
            f"{s.requests_per_s:.2f}",
            *(
                _fmt_ms(getattr(getattr(s, m), p))
                for m, p in (
                    ("ttft", "p50"),
                    ("ttft", "p90"),
                    ("ttft", "p99"),
                    ("itl", "p50"),
                    ("tpot", "p50"),
                    ("tpot", "p99"),
                    ("e2e", "p50"),
                    ("e2e", "p99"),
                )
            ),
        )
    return table


def error_lines(summaries: Sequence[RunSummary]) -> list[str]:
    """What the server said, once per kind of error and run: `http_404` alone does not say why."""
    return [
        f"{s.label}: {kind} x{count}: {s.error_details.get(kind, '(no detail)')}"
        for s in summaries
        for kind, count in sorted(s.errors.items())
    ]


def _fmt_ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.1f}ms"


async def _run(args: argparse.Namespace) -> int:
    workload = Workload(
        max_tokens=args.max_tokens,
        stream=args.stream,
        ignore_eos=args.ignore_eos,
        include_usage=args.usage,
        temperature=args.temperature,
        endpoint=args.endpoint,
        extra_body=dict(args.extra_body),
    )
    requests = request_limit(args.requests, args.duration)
    specs = [
        LoadSpec(
            concurrency=c,
            requests=requests,
            duration_s=args.duration,
            warmup=args.warmup,
            seed=args.seed,
        )
        for c in (args.concurrency or ([] if args.rate else [1]))
    ] + [
        LoadSpec(rate=r, requests=requests, duration_s=args.duration, warmup=args.warmup, seed=args.seed)
        for r in (args.rate or [])
    ]
    prompts = make_prompts(args, min(requests, _MAX_PROMPTS) + args.warmup)
    target = make_target(args, workload)
    results: list[tuple[RunSummary, tuple[RequestRecord, ...]]] = []
    await target.open(max(spec.max_in_flight for spec in specs))
    try:
        for spec in specs:
            result = await run_load(target, prompts, spec, progress=not args.no_progress)
            results.append((result.summary, result.records))
    finally:
        await target.aclose()
    out = Path(args.out or f"results/loadtest-{time.strftime('%Y%m%d-%H%M%S')}")
    config = {k: v for k, v in vars(args).items() if k != "api_key"}
    write_run(out, results, config)
    # A wide console even when piped: the table has 13 columns and must not be truncated.
    Console(width=max(Console().width, 200)).print(
        summary_table([s for s, _ in results], title=f"{target.name} -> {args.model}")
    )
    for line in error_lines([s for s, _ in results]):
        log.warning("%s", line)
    log.info("results written to %s/", out)
    return 1 if any(s.successes == 0 for s, _ in results) else 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.requests is not None and args.requests < 1) or args.max_tokens < 1 or args.prompt_tokens < 1:
        parser.error("--requests, --max-tokens and --prompt-tokens must be >= 1")
    return asyncio.run(_run(args))
