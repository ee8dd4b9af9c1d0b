"""Results on disk: JSON (everything), CSV (one row per request / per run) and PNG plots."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtest.metrics import RequestRecord, RunSummary

REQUEST_FIELDS = (
    "label",
    "index",
    "start_s",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "output_tokens",
    "prompt_tokens",
    "chunks",
    "usage_reported",
    "error",
    "error_detail",
)


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null, so other tools can read the file."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def summary_dict(summary: RunSummary) -> dict[str, Any]:
    return _clean(asdict(summary))


def request_rows(label: str, records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    t0 = min((r.start for r in records), default=0.0)

    def ms(x: float | None) -> float | None:
        return None if x is None else round(x * 1000.0, 4)

    return [
        {
            "label": label,
            "index": i,
            "start_s": round(r.start - t0, 6),
            "ttft_ms": ms(r.ttft),
            "tpot_ms": ms(r.tpot),
            "e2e_ms": ms(r.e2e),
            "output_tokens": r.output_tokens,
            "prompt_tokens": r.prompt_tokens,
            "chunks": len(r.chunk_times),
            "usage_reported": r.usage_reported,
            "error": r.error or "",
            "error_detail": r.error_detail or "",
        }
        for i, r in enumerate(records)
    ]


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_clean(dict(payload)), indent=2, sort_keys=False, default=str)
    path.write_text(text + "\n", encoding="utf-8")


def write_report(out: Path, name: str, markdown: str, payload: Mapping[str, Any]) -> None:
    """A benchmark's results in `out`: `name`.md (the report it prints) and `name`.json (every
    figure, with its config and start time)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(markdown, encoding="utf-8")
    write_json(out / f"{name}.json", payload)


def write_csv(path: Path, rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str] | None = None) -> None:
    rows = list(rows)
    if fieldnames is None:
        # Union of keys in first-seen order: runs with extra columns (CPU figures) still fit one file.
        seen: dict[str, None] = {}
        for row in rows:
            seen.update(dict.fromkeys(row))
        fieldnames = list(seen)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fieldnames), restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})


def write_run(
    out_dir: Path,
    results: Sequence[tuple[RunSummary, Sequence[RequestRecord]]],
    config: Mapping[str, Any],
) -> None:
    """results.json, summary.csv, requests.csv and, for two or more load levels, the sweep plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        out_dir / "results.json",
        {"config": dict(config), "runs": [summary_dict(s) for s, _ in results]},
    )
    write_csv(out_dir / "summary.csv", [s.flat() for s, _ in results])
    rows: list[dict[str, Any]] = []
    for summary, records in results:
        rows.extend(request_rows(summary.label, records))
    write_csv(out_dir / "requests.csv", rows, REQUEST_FIELDS)
    if len(results) >= 2:
        plot_sweep(out_dir / "latency_vs_throughput.png", {"": [s for s, _ in results]})


def plot_sweep(path: Path, series: Mapping[str, Sequence[RunSummary]], title: str | None = None) -> None:
    """Latency against output throughput, one line per series, one point per load level."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    panels = (
        ("ttft", "p50", "TTFT p50 (ms)"),
        ("ttft", "p99", "TTFT p99 (ms)"),
        ("tpot", "p50", "time per output token p50 (ms)"),
        ("e2e", "p50", "end-to-end latency p50 (ms)"),
    )
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, (metric, stat, ylabel) in zip(axes.flat, panels, strict=True):
        finite: list[float] = []
        for name, runs in series.items():
            xs = [r.output_tokens_per_s for r in runs]
            ys = [getattr(getattr(r, metric), stat) * 1000.0 for r in runs]
            finite.extend(y for y in ys if math.isfinite(y))
            ax.plot(xs, ys, marker="o", label=name or None)
            for r, x, y in zip(runs, xs, ys, strict=True):
                if not (math.isnan(x) or math.isnan(y)):
                    ax.annotate(f"{r.load:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(ylabel)
        # Log scale only where it helps (latencies spanning decades) and is valid (all positive).
        if finite and min(finite) > 0 and max(finite) / min(finite) > 20:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    if any(series):
        axes.flat[0].legend(fontsize=8)
    fig.suptitle(title or "latency vs throughput (labels: concurrency or rate)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
