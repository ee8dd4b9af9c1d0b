"""The benchmark's pure parts: the gateway command line, ratios against (a), medians over rounds,
the report, the CLI config, /proc reads."""

import csv
import json
import math
import os
import statistics
from pathlib import Path

import pytest

from loadtest import procstat
from loadtest.bench import (
    TARGETS,
    BenchConfig,
    LevelResult,
    Stack,
    TargetOutcome,
    build_parser,
    comparison_rows,
    config_from_args,
    gateway_command,
    markdown_table,
    median_summary,
    round_notes,
    round_rows,
    rounds_line,
    spread_table,
    target_checks,
    write_report,
)
from loadtest.metrics import RequestRecord, summarize
from loadtest.soak import max_overlap

STACK = Stack(
    grpc_url="127.0.0.1:8001", http_url="http://127.0.0.1:8000", tokenizer_dir="/tok", triton_pid=None
)
BY_KEY = {t.key: t for t in TARGETS}


def level(key, concurrency, tokens_per_s, ttft_ms, cpu_s, tokens=1000, rnd=1, errors=0, triton_cpu_s=0.5):
    """One measured level: 1000 tokens, so client CPU ms/token == cpu_s; `errors` failed requests more."""
    duration = tokens / tokens_per_s
    ttft = ttft_ms / 1000
    records = [RequestRecord(start=0.0, end=duration, chunk_times=(ttft, duration), output_tokens=tokens)]
    records += [RequestRecord(start=0.0, end=0.1, error="connection_closed") for _ in range(errors)]
    summary = summarize(records, label=key, mode="concurrency", load=concurrency, duration_s=duration)
    return LevelResult(key, BY_KEY[key].label, concurrency, summary, cpu_s, 0.1, triton_cpu_s, "test", rnd)


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
        "--triton-http-url",
        STACK.http_url,
    ]


def test_the_grpc_transport_row_leaves_the_http_url_out():
    cmd = gateway_command(9123, STACK, "ensemble", workers=1, extra=(), transport="grpc")
    assert "--triton-http-url" not in cmd


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
    # gateway 4.0 s against (a)'s 2.0 s for the same tokens at 64; concurrency 1 is left out.
    assert "vs (a) at concurrency 16 and above: 2.00x at 64 (target <= 1.0x): NOT met" in checks


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


# ------------------------------------------------------------------------------- rounds and medians

# Three interleaved rounds. (a) at concurrency 64 moves like the real one did (0.082-0.125 ms/token);
# the gateway failed to start in round 2; the engine route failed in every round.
GRPC64 = ((4000, 50, 0.082), (4400, 40, 0.125), (4100, 70, 0.098))  # (tok/s, TTFT ms, CPU ms/tok)
GW64 = ((3000, 80, 0.20), None, (3600, 60, 0.16))


def three_rounds():
    out = []
    for i in range(3):
        r = i + 1
        tps, ttft, cpu = GRPC64[i]
        out.append(
            TargetOutcome(
                BY_KEY["grpc"],
                (level("grpc", 1, 100, 10 + i, 1.0, rnd=r), level("grpc", 64, tps, ttft, cpu, rnd=r)),
                round=r,
            )
        )
        if GW64[i] is None:
            out.append(TargetOutcome(BY_KEY["gateway"], unavailable="NotReady: port in use", round=r))
        else:
            tps, ttft, cpu = GW64[i]
            out.append(
                TargetOutcome(
                    BY_KEY["gateway"],
                    (
                        level("gateway", 1, 95, 12, 1.2, rnd=r, errors=1 if r == 3 else 0),
                        level("gateway", 64, tps, ttft, cpu, rnd=r, errors=r),
                    ),
                    round=r,
                )
            )
        out.append(
            TargetOutcome(BY_KEY["gateway-engine"], unavailable="NotReady: exited with 1: boom", round=r)
        )
    return out


def by_cell(rows):
    return {(r["target"], r["concurrency"]): r for r in rows}


def test_cells_are_medians_over_an_odd_number_of_rounds():
    g = by_cell(comparison_rows(three_rounds()))[("grpc", 64)]
    assert (g["rounds"], g["rounds_total"]) == (3, 3)
    assert g["output_tokens_per_s"] == pytest.approx(4100)
    assert g["ttft_p50_ms"] == pytest.approx(50)
    assert g["ttft_p99_ms"] == pytest.approx(50)
    assert g["client_cpu_ms_per_token"] == pytest.approx(0.098)
    assert g["triton_cpu_ms_per_token"] == pytest.approx(0.5)
    assert (g["client_cpu_ms_per_token_min"], g["client_cpu_ms_per_token_max"]) == (
        pytest.approx(0.082),
        pytest.approx(0.125),
    )
    assert (g["output_tokens_per_s_min"], g["output_tokens_per_s_max"]) == (
        pytest.approx(4000),
        pytest.approx(4400),
    )


def test_an_even_number_of_rounds_takes_the_mean_of_the_middle_two():
    cpus = (0.30, 0.10, 0.40, 0.20)
    tps = (1000, 1300, 1100, 1200)
    ttfts = (10, 40, 20, 30)
    outs = [
        TargetOutcome(BY_KEY["grpc"], (level("grpc", 16, tps[i], ttfts[i], cpus[i], rnd=i + 1),), round=i + 1)
        for i in range(4)
    ]
    row = comparison_rows(outs)[0]
    assert row["rounds"] == 4
    assert row["client_cpu_ms_per_token"] == pytest.approx(statistics.median(cpus)) == pytest.approx(0.25)
    assert row["output_tokens_per_s"] == pytest.approx(1150)
    assert row["ttft_p50_ms"] == pytest.approx(25)
    assert "each cell is the median over the 4 rounds" in rounds_line(4)
    assert "mean of the middle two" in rounds_line(4)


def test_ratios_are_between_medians_not_medians_of_per_round_ratios():
    rows = by_cell(comparison_rows(three_rounds()))
    g64 = rows[("gateway", 64)]
    # The gateway's median over its two rounds, against (a)'s median over three.
    assert g64["client_cpu_ms_per_token"] == pytest.approx(0.18)
    assert g64["cpu_vs_a"] == pytest.approx(0.18 / 0.098)
    assert g64["output_tokens_per_s"] == pytest.approx(3300)
    assert g64["throughput_vs_a"] == pytest.approx(3300 / 4100)
    assert g64["ttft_p50_over_a_ms"] == pytest.approx(70 - 50)
    # The per-round rows keep each round's own ratio against (a) in that round.
    raw = {(r["target"], r["concurrency"], r["round"]): r for r in round_rows(three_rounds())}
    assert raw[("gateway", 64, 1)]["cpu_vs_a"] == pytest.approx(0.20 / 0.082)
    assert raw[("gateway", 64, 3)]["cpu_vs_a"] == pytest.approx(0.16 / 0.098)
    assert ("gateway", 64, 2) not in raw
    assert len(raw) == 2 * 3 + 2 * 2
    checks = "\n".join(target_checks(list(rows.values())))
    assert f"worst level {0.18 / 0.098:.2f}x" in checks


def test_errors_and_ok_are_summed_over_the_rounds():
    rows = by_cell(comparison_rows(three_rounds()))
    g64 = rows[("gateway", 64)]  # rounds 1 and 3: 1 + 3 failed requests next to one good one each
    assert (g64["successes"], g64["requests"], g64["errors"]) == (2, 6, 4)
    assert g64["error_kinds"] == "connection_closed=4"
    assert (rows[("grpc", 64)]["successes"], rows[("grpc", 64)]["requests"]) == (3, 3)
    table = markdown_table(list(rows.values()), three_rounds())
    assert "| (b) gateway, ensemble route [2/3 rounds] | 64 | 2/6 | connection_closed=4 | 3300 |" in table
    assert "| (a) Triton gRPC, Python client | 64 | 3/3 | 0 | 4100 | 1.00x |" in table


def test_spread_table_shows_min_max_and_range_over_median():
    spread = spread_table(comparison_rows(three_rounds()))
    lines = spread.splitlines()
    assert lines[0].startswith("| target | conc | rounds | out tok/s min-max")
    # (4400 - 4000) / 4100 = 10%; (0.125 - 0.082) / 0.098 = 44%
    assert "| (a) Triton gRPC, Python client | 64 | 3 | 4000-4400 (10%) | 0.082-0.125 (44%) |" in lines
    assert "| (b) gateway, ensemble route | 64 | 2 | 3000-3600 (18%) | 0.160-0.200 (22%) |" in lines
    assert "| (a) Triton gRPC, Python client | 1 | 3 | 100-100 (0%) | 1.000-1.000 (0%) |" in lines


def test_a_target_failing_in_one_round_uses_the_others_and_one_failing_in_all_is_unavailable():
    outs = three_rounds()
    rows = comparison_rows(outs)
    table = markdown_table(rows, outs)
    # gateway: failed in round 2 only -> measured, with the rounds it ran
    assert "(b) gateway, ensemble route [2/3 rounds] | 1 |" in table
    assert "gateway, ensemble route | - | - | did not run" not in table
    # gateway-engine: failed in all three -> one "did not run" line, the reason once
    assert table.count("did not run") == 1
    assert (
        "| (b) gateway, engine route | - | - | did not run (in all 3 rounds): NotReady: exited with 1: boom |"
        in table
    )
    lines = table.splitlines()
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    notes = round_notes(outs)
    assert len(notes) == 1
    assert (
        "(b) gateway, ensemble route failed in 1 of 3 rounds "
        "(round 2 after 0 level(s): NotReady: port in use)" in notes[0]
    )
    assert "ran completely in 2 of 3 rounds" in notes[0]


def test_median_summary_for_the_plots():
    levels = [lv for o in three_rounds() for lv in o.levels if (lv.target, lv.concurrency) == ("grpc", 64)]
    s = median_summary([lv.summary for lv in levels])
    assert s.output_tokens_per_s == pytest.approx(4100)
    assert s.ttft.p50 == pytest.approx(0.050)
    assert s.ttft.p99 == pytest.approx(0.050)
    assert (s.requests, s.successes, s.output_tokens, s.load) == (3, 3, 3000, 64)


def test_write_report_with_rounds_states_them_and_keeps_every_round(tmp_path):
    text = write_report(tmp_path, BenchConfig(), three_rounds(), soak=None)
    header = text.split("\n\n| target")[0]
    assert "Rounds: 3 (a round starts every target" in header
    assert "each cell is the median over the 3 rounds" in header
    assert "compare medians" in header
    assert "## Spread across rounds" in text
    assert "## Against the targets (medians over 3 rounds)" in text
    assert (tmp_path / "bench.md").read_text() == text
    with (tmp_path / "bench_rounds.csv").open() as fh:
        raw = list(csv.DictReader(fh))
    assert sorted({r["round"] for r in raw}) == ["1", "2", "3"]
    assert len(raw) == 10
    with (tmp_path / "bench.csv").open() as fh:
        medians = list(csv.DictReader(fh))
    assert len(medians) == 4
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["rounds"] == 3
    assert len(data["round_rows"]) == 10
    assert {r["round"] for r in data["runs"]} == {1, 2, 3}
    assert data["unavailable"] == {"gateway-engine": "NotReady: exited with 1: boom"}
    assert {(f["target"], f["round"]) for f in data["failures"]} == {
        ("gateway", 2),
        ("gateway-engine", 1),
        ("gateway-engine", 2),
        ("gateway-engine", 3),
    }
    for name in ("latency_vs_throughput.png", "cpu_per_token.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_a_single_round_report_says_so_and_has_no_spread_table(tmp_path):
    text = write_report(tmp_path, BenchConfig.quick(), outcomes(), soak=None)
    assert "Rounds: 1 (a round starts every target" in text
    assert "`--repeat N` for medians over N" in text
    assert "Spread across rounds" not in text
    assert "[1/1 rounds]" not in text


@pytest.mark.parametrize(
    ("argv", "repeats"),
    [
        ([], 3),
        (["--quick"], 1),
        (["--repeat", "5"], 5),
        (["--quick", "--repeat", "2"], 2),
        (["--repeat", "1"], 1),
    ],
)
def test_repeat_and_quick_set_the_rounds(argv, repeats):
    cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.repeats == repeats
    assert cfg.concurrencies == ((1, 16) if "--quick" in argv else (1, 16, 64, 256))


def test_repeat_must_be_positive():
    with pytest.raises(SystemExit):
        config_from_args(build_parser().parse_args(["--repeat", "0"]))


async def test_a_round_measures_each_level_on_every_target_before_the_next_level(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import contextlib

    from loadtest import bench

    events: list[str] = []

    @contextlib.asynccontextmanager
    async def fake_start(target, stack, cfg, workload, workdir):  # type: ignore[no-untyped-def]
        if target.key == "litellm":
            raise OSError("not installable here")
        events.append(f"start {target.key}")
        yield bench.Running(client=None, pid=0, include_children=False, measured="fake")  # type: ignore[arg-type]
        events.append(f"stop {target.key}")

    async def fake_measure(running, target, prompts, c, cfg, stack, round_no):  # type: ignore[no-untyped-def]
        events.append(f"{target.key} c={c}")
        if target.key == "triton-http" and c == 16:
            raise RuntimeError("lost")
        records = (RequestRecord(start=0.0, end=1.0, chunk_times=(0.5,), output_tokens=1),)
        summary = summarize(records, label="x", mode="concurrency", load=c)
        level = bench.LevelResult(target.key, target.label, c, summary, 1.0, 1.0, 1.0, "fake", round_no)
        return level, records

    monkeypatch.setattr(bench, "start_target", fake_start)
    monkeypatch.setattr(bench, "measure_level", fake_measure)
    cfg = bench.BenchConfig(concurrencies=(1, 16))
    stack = bench.Stack("h:1", "http://h:2", str(tmp_path), None)
    selected = [t for t in bench.TARGETS if t.key in ("grpc", "gateway", "triton-http", "litellm")]
    outcomes = await bench.run_round(selected, stack, cfg, None, [], tmp_path, 2)  # type: ignore[arg-type]

    assert events == [
        "start grpc",
        "start gateway",
        "start triton-http",
        "grpc c=1",
        "gateway c=1",
        "triton-http c=1",
        "grpc c=16",
        "gateway c=16",
        "triton-http c=16",
        "stop triton-http",
        "stop gateway",
        "stop grpc",
    ]
    by_key = {o.target.key: o for o in outcomes}
    assert [lv.concurrency for lv in by_key["gateway"].levels] == [1, 16] and by_key["gateway"].round == 2
    assert by_key["gateway"].unavailable is None
    assert by_key["litellm"].unavailable == "OSError: not installable here" and not by_key["litellm"].levels
    # A target that fails mid-round keeps the levels it measured and is not tried again this round.
    assert [lv.concurrency for lv in by_key["triton-http"].levels] == [1]
    assert by_key["triton-http"].unavailable == "RuntimeError: lost"
