"""make bench-host's arithmetic: cells into rows (medians over rounds), what bound each cell, the verdicts."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from loadtest import bench_host
from loadtest.bench_host import Cell, HostConfig, HostStack, classify, config_from_args, rows, verdicts
from loadtest.metrics import RequestRecord, summarize

CFG = HostConfig(workers=(1, 8), concurrencies=(64,), apis=("completions",), step_ms=5.0)


def _cell(
    workers: int, tokens_per_s: float, cpu_s: float, cores: tuple[float, ...], tpot_ms: float, r: int = 1
):
    # 100 requests of 64 tokens evenly spaced by tpot_ms, over a window that gives tokens_per_s.
    tokens = 6400
    window = tokens / tokens_per_s
    gap = tpot_ms / 1000
    records = [
        RequestRecord(
            start=0.0,
            end=0.01 + 63 * gap,
            chunk_times=tuple(0.01 + i * gap for i in range(64)),
            output_tokens=64,
        )
        for _ in range(100)
    ]
    summary = summarize(records, label="x", mode="concurrency", load=64, duration_s=window)
    return Cell(
        workers, "completions", 64, r, summary, window, cpu_s, tuple(c * window for c in cores), 1.0, 1.0
    )


def test_cells_are_gateway_bound_engine_paced_or_triton_bound() -> None:
    assert classify({"cores_per_worker_max": 0.95, "tpot_p50_ms": 20.0}, CFG) == "gateway-bound"
    assert classify({"cores_per_worker_max": 0.5, "tpot_p50_ms": 6.1}, CFG) == "Triton-bound"
    assert classify({"cores_per_worker_max": 0.5, "tpot_p50_ms": 6.0}, CFG) == "engine-paced"
    assert classify({"cores_per_worker_max": math.nan, "tpot_p50_ms": 5.0}, CFG) == "engine-paced"


def test_rows_take_medians_over_rounds_and_ratios_against_the_fewest_workers() -> None:
    cells = [
        _cell(1, 8000, 1.2, (1.5,), 7.0, r=1),
        _cell(1, 8000, 1.6, (1.5,), 7.0, r=2),
        _cell(1, 8000, 1.4, (1.5,), 7.0, r=3),
        _cell(8, 12000, 1.68, (0.3, 0.4, 0.5, 0.6, 0.3, 0.4, 0.5, 0.6), 5.0),
    ]
    table = rows(cells, CFG)
    one, eight = table
    assert one["rounds"] == 3 and one["workers"] == 1
    assert one["gateway_cpu_ms_per_token"] == pytest.approx(1.4 * 1000 / 6400)
    assert eight["cpu_vs_1"] == pytest.approx(1.2)
    assert eight["vs_linear"] == pytest.approx(12000 / (8000 * 8), rel=1e-3)
    assert eight["cores_per_worker_min"] == pytest.approx(0.3) and eight[
        "cores_per_worker_max"
    ] == pytest.approx(0.6)
    assert eight["evenness"] == pytest.approx(0.5)
    assert one["bound"] == "gateway-bound" and eight["bound"] == "engine-paced"
    lines = verdicts(table, CFG)
    assert len(lines) == 1 and "(1.20x; target <= 1.20x: met)" in lines[0]
    assert "0.83x of 1's" in lines[0] and "target >= 0.8x: met" in lines[0]


def test_a_triton_bound_cell_is_not_counted() -> None:
    cells = [_cell(1, 8000, 1.4, (1.5,), 7.0), _cell(8, 12000, 2.0, (0.3,) * 8, 9.0)]
    table = rows(cells, CFG)
    assert table[1]["triton_bound"]
    assert verdicts(table, CFG) == ["- completions c=64: not counted (8 worker(s) Triton-bound)"]
    assert "Triton-bound" in bench_host.markdown_table(table, CFG)


def test_the_gateway_gets_every_triton_the_engine_route_and_extra_flags() -> None:
    stack = HostStack(
        grpc_urls=("127.0.0.1:1", "127.0.0.1:2"),
        tokenizer_dir="/t",
        triton_pids=(),
        http_urls=("http://127.0.0.1:3", "http://127.0.0.1:4"),
    )
    cmd = bench_host.gateway_command(9000, stack, 8, ("--worker-sockets", "shared"))
    assert cmd[cmd.index("--triton-url") + 1] == "127.0.0.1:1" and cmd.count("--triton-url") == 2
    # The HTTP hot path by default: each Triton's HTTP URL, in the gRPC URLs' order.
    http = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--triton-http-url"]
    assert http == ["http://127.0.0.1:3", "http://127.0.0.1:4"]
    assert "route=engine,engine_model=tensorrt_llm" in cmd[cmd.index("--model") + 1]
    assert cmd[-4:] == ["--workers", "8", "--worker-sockets", "shared"]
    assert "--workers" not in bench_host.gateway_command(9000, stack, 1)
    assert "--triton-http-url" not in bench_host.gateway_command(9000, stack, 8, transport="grpc")
    with pytest.raises(ValueError):
        bench_host.gateway_command(9000, replace(stack, http_urls=()), 8)


def test_the_small_variant_and_flags() -> None:
    args = bench_host.build_parser().parse_args(["--small", "--workers", "2,1", "--gateway-arg", "--a b"])
    cfg = config_from_args(args)
    assert cfg.workers == (1, 2) and cfg.concurrencies == HostConfig.small().concurrencies
    assert cfg.gateway_extra_args == ("--a", "b")
    with pytest.raises(SystemExit):
        config_from_args(bench_host.build_parser().parse_args(["--apis", "nope"]))


def _matched(workers: int, k: int, cpu_s: float, cores: tuple[float, ...], conns: tuple[int, ...]) -> Cell:
    cell = _cell(workers, 1000.0 * workers, cpu_s, cores, 5.0)
    return replace(cell, concurrency=k * workers, per_worker=k, worker_connections=conns)


def test_matched_load_rows_are_their_own_view_and_never_enter_the_issues_verdicts() -> None:
    cfg = replace(CFG, per_worker_concurrencies=(8,))
    cells = [
        _cell(1, 8000, 1.4, (1.5,), 7.0),
        _cell(8, 12000, 2.0, (0.3,) * 8, 5.0),
        # 8 streams per worker: 8 at one worker, 64 at eight (the issue's c=64 cell at 8 is another row).
        _matched(1, 8, 1.0, (0.2,), (8,)),
        _matched(8, 8, 1.1, (0.2, 0.3, 0.2, 0.2, 0.2, 0.25, 0.2, 0.2), (6, 10, 8, 8, 8, 8, 8, 8)),
    ]
    table = rows(cells, cfg)
    fixed = [r for r in table if not r["per_worker"]]
    matched = [r for r in table if r["per_worker"]]
    assert [(r["workers"], r["concurrency"]) for r in fixed] == [(1, 64), (8, 64)]
    assert [(r["workers"], r["concurrency"]) for r in matched] == [(1, 8), (8, 64)]
    assert matched[1]["cpu_vs_1"] == pytest.approx(1.1)  # against the matched 1-worker row
    assert matched[1]["connections_per_worker_min"] == 6 and matched[1]["connections_per_worker_max"] == 10
    # The issue's verdicts read only its own cells: 2.0 / 1.4 ms, not the matched 1.1x.
    (line,) = verdicts(table, cfg)
    assert "(1.43x; target <= 1.20x: NOT met)" in line
    (view,) = bench_host.matched_lines(table, cfg)
    assert view.startswith("- completions, 8 streams per worker:") and "8w 0.172 ms (1.10x)" in view
    assert "64 (8/worker)" in bench_host.markdown_table(matched, cfg)


def test_a_saturated_load_generator_marks_the_cell_and_it_is_not_counted() -> None:
    cells = [_cell(1, 8000, 1.4, (0.5,), 5.0), _cell(8, 12000, 1.5, (0.3,) * 8, 5.0)]
    cells[1] = replace(cells[1], loadgen_cpu_s=1.9 * cells[1].window_s)  # 1.9 of 2 cores
    table = rows(cells, CFG, loadgen_capacity=2.0)
    assert table[0]["bound"] == "engine-paced" and table[1]["bound"] == "load-generator-bound"
    assert not table[1]["counted"]
    assert verdicts(table, CFG) == ["- completions c=64: not counted (8 worker(s) load-generator-bound)"]
    # A starved load generator comes first: it also leaves a worker busy (the lent host's 8-worker
    # cells at c=1024 read gateway-bound with their load generator at 0.82-0.89 of its 2 cpus).
    assert classify({"cores_per_worker_max": 0.9, "tpot_p50_ms": 5.0, "loadgen_saturated": True}, CFG) == (
        "load-generator-bound"
    )
    cells[1] = replace(cells[1], loadgen_cpu_s=1.63 * cells[1].window_s)
    assert rows(cells, CFG, loadgen_capacity=2.0)[1]["bound"] == "load-generator-bound"
    cells[1] = replace(cells[1], loadgen_cpu_s=1.7 * cells[1].window_s)  # of 3 cpus: room left
    assert rows(cells, CFG, loadgen_capacity=3.0)[1]["bound"] == "engine-paced"


def test_the_load_generator_gets_cpus_for_the_most_workers_run() -> None:
    # 16 cpus: 3 for eight workers (what carried c=1024 there), an eighth of the host for fewer.
    assert bench_host.loadgen_cpus_for(CFG, 16) == 3
    assert bench_host.loadgen_cpus_for(replace(CFG, workers=(1, 2)), 16) == 2
    assert bench_host.loadgen_cpus_for(replace(CFG, workers=(1,)), 2) == 1
    assert bench_host.loadgen_cpus_for(replace(CFG, loadgen_cpus=5), 16) == 5
    cores = [(c,) for c in range(16)]
    plan = bench_host.plan_cpus(cores, 8, bench_host.loadgen_cpus_for(CFG, 16))
    assert (len(plan.loadgen), len(plan.triton), len(plan.workers)) == (3, 5, 8)


def test_transport_connections_placement_and_matched_levels_from_flags() -> None:
    cfg = config_from_args(bench_host.build_parser().parse_args([]))
    assert (cfg.transport, cfg.connections, cfg.placement) == ("http", "fresh", "auto")
    assert cfg.per_worker_concurrencies == (4, 8)
    args = bench_host.build_parser().parse_args(
        [
            "--transport",
            "grpc",
            "--connections",
            "keep-alive",
            "--placement",
            "off",
            "--loadgen-cpus",
            "3",
            "--per-worker-concurrency",
            "16,2",
        ]
    )
    cfg = config_from_args(args)
    assert (cfg.transport, cfg.connections, cfg.placement, cfg.loadgen_cpus) == (
        "grpc",
        "keep-alive",
        "off",
        3,
    )
    assert cfg.per_worker_concurrencies == (2, 16)
    assert (
        config_from_args(
            bench_host.build_parser().parse_args(["--per-worker-concurrency", "0"])
        ).per_worker_concurrencies
        == ()
    )
    assert bench_host.cpu_plan(replace(cfg, placement="off"))[0] is None


def test_the_gpu_engine_flag_takes_the_reference_engine_with_fewer_instances() -> None:
    cfg = config_from_args(bench_host.build_parser().parse_args(["--engine", "gpu"]))
    assert cfg.engine_mode == "gpu" and cfg.engine_instances == bench_host.GPU_ENGINE_INSTANCES
    cfg = config_from_args(
        bench_host.build_parser().parse_args(["--engine", "gpu", "--engine-instances", "3"])
    )
    assert cfg.engine_instances == 3
    assert config_from_args(bench_host.build_parser().parse_args([])).engine_mode == "synthetic"
    assert bench_host.engine_description(HostConfig()) == "synthetic, step 5 ms"
