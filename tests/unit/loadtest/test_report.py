"""Results on disk: JSON without NaN, CSV rows per request and per run, and the sweep plot."""

import argparse
import csv
import json
import math
from pathlib import Path

from loadtest.metrics import RequestRecord, summarize
from loadtest.report import REQUEST_FIELDS, plot_sweep, write_csv, write_report, write_run
from loadtest.subproc import given_args, results_dir


def run(load, ttft):
    records = [
        RequestRecord(start=0.0, end=ttft + 0.09, chunk_times=(ttft, ttft + 0.09), output_tokens=10),
        RequestRecord(start=0.0, end=0.5, error="http_503", error_detail="overloaded"),
    ]
    return summarize(records, label=f"c={load}", mode="concurrency", load=load, duration_s=1.0), records


def test_write_run_writes_json_csv_and_the_sweep_plot(tmp_path):
    results = [run(1, 0.01), run(16, 0.05)]
    write_run(tmp_path, results, {"model": "tiny"})

    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["config"] == {"model": "tiny"}
    assert [r["label"] for r in payload["runs"]] == ["c=1", "c=16"]
    assert payload["runs"][0]["errors"] == {"http_503": 1}
    assert payload["runs"][0]["itl"]["p50"] is None or isinstance(payload["runs"][0]["itl"]["p50"], float)

    with (tmp_path / "summary.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["load"] for r in rows] == ["1", "16"]
    assert float(rows[1]["ttft_p50_ms"]) == 50.0
    assert rows[0]["error_kinds"] == "http_503=1"

    with (tmp_path / "requests.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames) == REQUEST_FIELDS
        reqs = list(reader)
    assert len(reqs) == 4
    assert reqs[1]["error"] == "http_503"
    assert reqs[1]["ttft_ms"] == ""
    assert float(reqs[0]["ttft_ms"]) == 10.0

    png = (tmp_path / "latency_vs_throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_csv_columns_are_the_union_of_row_keys(tmp_path):
    write_csv(tmp_path / "x.csv", [{"a": 1}, {"a": 2, "b": None}])
    assert (tmp_path / "x.csv").read_text().splitlines() == ["a,b", "1,", "2,"]


def test_plot_tolerates_runs_without_successes(tmp_path):
    failed = summarize([RequestRecord(0.0, 1.0, error="x")], label="f", mode="concurrency", load=1)
    plot_sweep(tmp_path / "p.png", {"failing": [failed], "ok": [run(1, 0.01)[0], run(4, 0.02)[0]]})
    assert (tmp_path / "p.png").stat().st_size > 0


def test_a_benchmark_report_is_its_markdown_and_its_figures_as_strict_json(tmp_path):
    write_report(
        tmp_path / "out", "bench_x", "# Report\n", {"ratio": math.nan, "where": Path("/w"), "n": (1, 2)}
    )
    assert (tmp_path / "out" / "bench_x.md").read_text() == "# Report\n"
    text = (tmp_path / "out" / "bench_x.json").read_text()
    assert "NaN" not in text
    assert json.loads(text) == {"ratio": None, "where": "/w", "n": [1, 2]}


def test_only_the_options_given_on_the_command_line_change_the_config():
    args = argparse.Namespace(phase_s=2.0, users=None, workers=0, out="results")
    assert given_args(args, "phase_s", "users", "workers", out="out_dir") == {
        "phase_s": 2.0,
        "workers": 0,  # zero is given, not left out
        "out_dir": "results",
    }


def test_results_go_to_the_named_directory_or_a_timestamped_one(tmp_path, monkeypatch):
    assert results_dir(str(tmp_path / "mine"), "long") == tmp_path / "mine"
    assert (tmp_path / "mine" / "work").is_dir()
    monkeypatch.chdir(tmp_path)
    out = results_dir(None, "long")
    assert out.parent == Path("results") and out.name.startswith("long-") and (out / "work").is_dir()
