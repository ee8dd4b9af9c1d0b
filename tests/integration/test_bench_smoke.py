"""Every `make bench*` target's quick variant, at its smallest, end to end: each starts its own
stack as the make target does (from a working directory of its own, with a relative `--out`, as a
user types it), so a change that breaks a benchmark fails here rather than on the day it is run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run_bench(module: str, args: list[str], cwd: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (
        f"{module} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def test_make_bench_quick(tmp_path: Path) -> None:
    out = run_bench(
        "loadtest.bench",
        [
            "--quick",
            "--targets",
            "grpc,gateway",
            "--concurrency",
            "1",
            "--level-duration",
            "1",
            "--out",
            "results",
        ],
        tmp_path,
    )
    rows = re.findall(r"^\| \((?:a|b)\)[^|]*\| 1 \| (\d+)/(\d+) \| (\d+) \|", out, re.M)
    assert len(rows) == 2, out
    assert all(ok == req and ok != "0" and errors == "0" for ok, req, errors in rows), out
    assert (tmp_path / "results" / "bench.md").is_file()


def test_make_bench_routing_quick(tmp_path: Path) -> None:
    out = run_bench(
        "loadtest.bench_routing",
        [
            "--quick",
            "--replicas",
            "1",
            "--users",
            "2",
            "--requests",
            "4",
            "--policies",
            "round_robin",
            "--workloads",
            "control",
            "--no-baseline",
            "--scenarios",
            "",
            "--out",
            "results",
        ],
        tmp_path,
    )
    rows = json.loads((tmp_path / "results" / "bench_routing.json").read_text())["rows"]
    assert [(r["workload"], r["policy"]) for r in rows] == [("control", "round_robin")], out
    assert rows[0]["requests"] > 0 and rows[0]["errors"] == 0, rows


def test_make_bench_host_small(tmp_path: Path) -> None:
    run_bench(
        "loadtest.bench_host",
        [
            "--small",
            "--workers",
            "1",
            "--concurrency",
            "2",
            "--apis",
            "completions",
            "--repeat",
            "1",
            "--engine-instances",
            "1",
            "--load-processes",
            "1",
            "--level-duration",
            "1",
            "--per-worker-concurrency",
            "0",
            "--placement",
            "off",
            "--out",
            "results",
        ],
        tmp_path,
    )
    cells = json.loads((tmp_path / "results" / "bench_host.json").read_text())["cells"]
    assert cells and all(c["summary"]["successes"] > 0 and not c["summary"]["errors"] for c in cells), cells


def test_make_bench_long_quick(tmp_path: Path) -> None:
    # bench_long exits non-zero on any failed request.
    out = run_bench("loadtest.bench_long", ["--quick", "--phase-s", "1", "--out", "results"], tmp_path)
    data = json.loads((tmp_path / "results" / "bench_long.json").read_text())
    (row,) = data["rows"]
    assert row["mixed_long_requests"] > 0 and row["saturate"], out


def test_make_bench_images_quick(tmp_path: Path) -> None:
    # The default workload (1-megapixel JPEGs as data: URIs to the tiny vision-language model, text
    # streams on the native engine), one short round; bench_images exits non-zero on any failed request.
    out = run_bench("loadtest.bench_images", ["--quick", "--out", "results"], tmp_path)
    row = json.loads((tmp_path / "results" / "bench_images.json").read_text())
    assert row["config"]["image_width"] * row["config"]["image_height"] >= 1_000_000, row["config"]
    assert row["image_requests"] > 0 and row["image_error_count"] == 0, out
    assert row["text_itl_ms"]["alone"]["count"] > 0 and row["text_itl_ms"]["images"]["count"] > 0, out
    assert "inter-token p99 with ~1 MP JPEG requests / alone" in out
