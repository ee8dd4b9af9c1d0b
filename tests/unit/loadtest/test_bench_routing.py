"""make bench-routing's pure parts: the request streams, the metrics it reads, the verdicts."""

from __future__ import annotations

import itertools

from loadtest.bench_routing import (
    RoutingBenchConfig,
    RunResult,
    conversations,
    metric,
    rotated,
    run_salt,
    summary_rows,
    verdicts,
)

CFG = RoutingBenchConfig(documents=4, document_words=20, question_words=3, turns=2)


def _take(workload: str, slot: int, salt: str, n: int = 6) -> list:
    return list(itertools.islice(conversations(CFG, workload, slot, salt), n))


def test_every_policy_gets_the_same_stream_but_for_the_salt() -> None:
    a, b = _take("shared", 3, "run x"), _take("shared", 3, "run y")
    assert [c.questions for c in a] == [c.questions for c in b]
    assert [c.document.removeprefix("run x ") for c in a] == [c.document.removeprefix("run y ") for c in b]
    assert all(c.document.startswith("run x ") for c in a)


def test_shared_conversations_draw_from_a_few_documents_and_the_control_shares_none() -> None:
    shared = {c.document for slot in range(8) for c in _take("shared", slot, "s")}
    assert len(shared) <= CFG.documents
    control = [c.document for slot in range(8) for c in _take("control", slot, "s")]
    assert len(set(control)) == len(control)
    assert all(len(c.questions) == 1 for c in _take("control", 0, "s"))


def test_the_skewed_workload_favours_its_first_document() -> None:
    docs = [c.document for slot in range(40) for c in _take("skewed", slot, "s", 5)]
    counts = sorted((docs.count(d) for d in set(docs)), reverse=True)
    assert counts[0] > 2 * counts[1]


def test_salts_differ_per_run_and_rounds_rotate_the_policies() -> None:
    assert len({run_salt(w, p, r) for w in "ab" for p in "xyz" for r in (1, 2)}) == 12
    assert rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotated(["a", "b", "c"], 3) == ["a", "b", "c"]


def test_metric_sums_the_samples_whose_labels_match() -> None:
    text = (
        "# HELP nv_inference_request_success x\n"
        'nv_inference_request_success{model="tensorrt_llm",version="1"} 12\n'
        'nv_inference_request_success{model="other",version="1"} 5\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm"} 7\n'
    )
    assert metric(text, "nv_inference_request_success", model="tensorrt_llm") == 12
    assert metric(text, "nv_inference_request_success") == 17
    assert metric(text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="reused") == 7


def _run(
    workload: str, policy: str, round_no: int, p50: float, tps: float, hit: float, load: tuple
) -> RunResult:
    return RunResult(
        workload=workload,
        policy=policy,
        round=round_no,
        requests=10,
        errors={},
        error_details={},
        duration_s=1.0,
        output_tokens=int(tps),
        prompt_tokens=1000,
        cached_tokens=int(hit * 1000),
        ttft_ms={"p50": p50, "p90": p50, "p99": p50 * 2, "mean": p50},
        per_replica_requests=load,
        per_replica_reused_blocks=(0.0,) * len(load),
    )


def test_the_verdicts_follow_the_issue_targets() -> None:
    even, hot = (5.0, 5.0, 5.0, 5.0), (8.0, 4.0, 4.0, 4.0)
    results = [
        _run("shared", "least_outstanding", 1, 400, 300, 0.5, even),
        _run("shared", "prefix", 1, 150, 320, 0.78, even),
        _run("control", "least_outstanding", 1, 500, 200, 0.0, even),
        _run("control", "least_outstanding", 2, 560, 200, 0.0, even),
        _run("control", "prefix", 1, 540, 200, 0.0, even),
        _run("control", "prefix", 2, 560, 200, 0.0, even),
        _run("skewed", "prefix", 1, 200, 300, 0.8, hot),
    ]
    single = [_run("shared", "single", 1, 900, 100, 0.9, (20.0,))]
    rows = summary_rows(results)
    met = {
        v["target"].split(":")[0] + str(i): v["met"] for i, v in enumerate(verdicts(rows, results, single))
    }
    # 2.67x lower TTFT at more throughput; 0.78 >= 0.8 * 0.9; +20 ms within a 60 ms spread; 8 / 5 > 1.5.
    assert met == {"shared0": True, "shared1": True, "control2": True, "skewed3": False}
