"""The benchmark's pure parts: the gateway command line, ratios against (a), the report, /proc reads."""

import math
import os
from pathlib import Path

import pytest

from loadtest import procstat
from loadtest.bench import (
    TARGETS,
    BenchConfig,
    LevelResult,
    Stack,
    TargetOutcome,
    comparison_rows,
    gateway_command,
    markdown_table,
    target_checks,
    write_report,
)
from loadtest.metrics import RequestRecord, summarize
from loadtest.soak import max_overlap

STACK = Stack(
    grpc_url="127.0.0.1:8001", http_url="http://127.0.0.1:8000", tokenizer_dir="/tok", triton_pid=None
)
BY_KEY = {t.key: t for t in TARGETS}


def level(key, concurrency, tokens_per_s, ttft_ms, cpu_s, tokens=1000):
    duration = tokens / tokens_per_s
    ttft = ttft_ms / 1000
    records = [RequestRecord(start=0.0, end=duration, chunk_times=(ttft, duration), output_tokens=tokens)]
    summary = summarize(records, label=key, mode="concurrency", load=concurrency, duration_s=duration)
    return LevelResult(key, BY_KEY[key].label, concurrency, summary, cpu_s, 0.1, 0.5, "test")


def test_gateway_command_is_the_documented_command_line():
    cmd = gateway_command(9123, STACK, "ensemble", workers=1, extra=())
    assert cmd[1:] == [
        "-m",
        "gateway.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "9123",
        "--triton-url",
        "127.0.0.1:8001",
        "--model",
        "name=tiny,triton_model=ensemble,tokenizer=/tok,route=ensemble",
    ]


def test_gateway_engine_route_and_workers_are_added():
    cmd = gateway_command(1, STACK, "engine", workers=3, extra=("--log-level", "warning"))
    assert cmd[cmd.index("--model") + 1].endswith("route=engine,engine_model=tensorrt_llm")
    assert cmd[-4:] == ["--workers", "3", "--log-level", "warning"]


def outcomes():
    return [
        TargetOutcome(BY_KEY["grpc"], (level("grpc", 1, 100, 10, 1.0), level("grpc", 64, 1000, 50, 2.0))),
        TargetOutcome(
            BY_KEY["gateway"], (level("gateway", 1, 95, 11.5, 1.2), level("gateway", 64, 900, 60, 4.0))
        ),
        TargetOutcome(BY_KEY["litellm"], (level("litellm", 64, 200, 500, 20.0),)),
        TargetOutcome(BY_KEY["gateway-engine"], unavailable="NotReady: exited with 1: boom"),
    ]


def test_rows_carry_ratios_against_the_direct_grpc_client():
    rows = {(r["target"], r["concurrency"]): r for r in comparison_rows(outcomes())}
    g64 = rows[("gateway", 64)]
    assert g64["throughput_vs_a"] == pytest.approx(0.9)
    assert g64["client_cpu_ms_per_token"] == pytest.approx(4.0)
    assert g64["cpu_vs_a"] == pytest.approx(2.0)
    assert rows[("gateway", 1)]["ttft_p50_over_a_ms"] == pytest.approx(1.5)
    assert rows[("grpc", 1)]["cpu_vs_a"] == pytest.approx(1.0)
    assert math.isnan(rows[("litellm", 64)]["ttft_p50_over_a_ms"]) is False


def test_target_checks_state_each_target_with_its_figure():
    checks = "\n".join(target_checks(comparison_rows(outcomes())))
    assert "CPU per streamed token vs (a), worst level 2.00x (target <= 1.5x): NOT met" in checks
    assert "TTFT p50 overhead at concurrency 1: +1.50 ms (target <= 2 ms): met" in checks
    assert "throughput vs (a) at concurrency 64: 0.90x (target >= 0.8x): met" in checks
    assert "gateway vs LiteLLM at concurrency 64: throughput 4.50x" in checks


def test_markdown_table_lists_every_row_and_why_a_target_did_not_run():
    rows = comparison_rows(outcomes())
    table = markdown_table(rows, outcomes())
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows) + 1
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "did not run: NotReady: exited with 1: boom" in table


def test_write_report_writes_markdown_csv_json_and_plots(tmp_path):
    text = write_report(tmp_path, BenchConfig(), outcomes(), soak={"streams": 10, "met": True})
    assert text.startswith("# Benchmark")
    for name in (
        "bench.md",
        "bench.csv",
        "bench.json",
        "requests.csv",
        "latency_vs_throughput.png",
        "cpu_per_token.png",
    ):
        assert (tmp_path / name).stat().st_size > 0


def test_cpu_times_of_this_process_grow_with_work():
    before = procstat.cpu_times(os.getpid(), include_children=False)
    deadline = procstat.cpu_times(os.getpid(), include_children=False).total_s + 0.05
    x = 0
    while procstat.cpu_times(os.getpid(), include_children=False).total_s < deadline:
        x += sum(range(10_000))
    after = procstat.cpu_times(os.getpid(), include_children=False)
    assert (after - before).total_s >= 0.05 - 1e-9
    assert procstat.rss_bytes(os.getpid()) > 10 * 1024 * 1024


def test_stat_parsing_survives_parentheses_and_spaces_in_the_command_name(tmp_path, monkeypatch):
    proc = tmp_path / "4242"
    proc.mkdir()
    fields = ["S", "1", *["0"] * 9, "250", "50", "7", "3"] + ["0"] * 30
    (proc / "stat").write_text("4242 (weird) name (x)) " + " ".join(fields) + "\n")
    monkeypatch.setattr(procstat, "_PROC", Path(tmp_path))
    sample = procstat.cpu_times(4242, include_children=False)
    ticks = os.sysconf("SC_CLK_TCK")
    assert (sample.user_s, sample.system_s) == (250 / ticks, 50 / ticks)
    with_children = procstat.cpu_times(4242)
    assert with_children.total_s == pytest.approx((250 + 50 + 7 + 3) / ticks)


def test_max_overlap_counts_requests_in_flight_together():
    recs = [
        RequestRecord(0.0, 2.0),
        RequestRecord(1.0, 3.0),
        RequestRecord(2.0, 4.0),
        RequestRecord(2.5, 2.6),
    ]
    # At t=2.0 the first ends as the third starts: ends are counted first.
    assert max_overlap(recs) == 3
