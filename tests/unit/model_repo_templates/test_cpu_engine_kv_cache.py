"""The CPU engine's paged KV cache: chained block keys, prefix reuse, LRU eviction, per-request figures."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from tests.unit.model_repo_templates.test_cpu_engine_guided import engine

PERF = frozenset(
    {"output_ids", "kv_cache_reused_blocks", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks"}
)


def test_block_keys_chain_so_a_change_alters_every_later_block() -> None:
    tokens = list(range(40))
    keys = engine.block_keys(tokens, 8)
    assert len(keys) == 5
    assert engine.block_keys(tokens, 8) == keys
    changed = engine.block_keys([*tokens[:12], 999, *tokens[13:]], 8)
    assert changed[0] == keys[0]
    assert all(a != b for a, b in zip(changed[1:], keys[1:], strict=True))
    # A partial last block has no key.
    assert engine.block_keys(tokens[:15], 8) == keys[:1]


def test_a_repeated_prompt_reuses_its_whole_blocks_but_never_the_last_token() -> None:
    kv = engine.KvCacheManager(tokens_per_block=4, max_blocks=100, reuse=True)
    prompt = list(range(1, 13))  # 3 whole blocks
    first = kv.start(prompt)
    assert (first.reused, first.allocated, first.new) == (0, 3, 3)
    kv.release(first, [*prompt, 50])
    second = kv.start(prompt)
    # Only 11 tokens may be matched: the block holding the last prompt token is computed again.
    assert (second.reused, second.allocated) == (2, 3)
    kv.release(second, [*prompt, 50])
    longer = kv.start([*prompt, 50, 51, 52, 53])
    # The first answer's token completed no block (its own KV is never computed): 3 prompt blocks.
    assert longer.reused == 3
    assert kv.stats().reused_blocks == 5


def test_without_reuse_nothing_is_cached() -> None:
    kv = engine.KvCacheManager(tokens_per_block=4, max_blocks=100, reuse=False)
    prompt = list(range(1, 13))
    kv.release(kv.start(prompt), prompt)
    assert kv.start(prompt).reused == 0
    assert kv.stats().used_blocks == 3


def test_least_recently_used_blocks_are_evicted_under_the_budget() -> None:
    kv = engine.KvCacheManager(tokens_per_block=4, max_blocks=6, reuse=True)
    a, b, c = ([p] * 9 for p in (1, 2, 3))  # 3 blocks each, 2 of them keyed
    kv.release(kv.start(a), a)
    kv.release(kv.start(b), b)
    assert kv.cached_prefix_blocks(a) == 2 and kv.cached_prefix_blocks(b) == 2
    # c needs 3 blocks, 4 are cached, 6 fit: one goes, from a (least recently used), deepest first.
    blocks = kv.start(c)
    assert kv.cached_prefix_blocks(a) == 1
    assert kv.cached_prefix_blocks(b) == 2
    stats = kv.stats()
    assert (stats.used_blocks, stats.free_blocks, stats.max_blocks) == (3, 3, 6)
    kv.release(blocks, c)
    assert kv.stats().used_blocks == 0


def test_blocks_held_by_a_running_sequence_are_shared_and_never_evicted() -> None:
    kv = engine.KvCacheManager(tokens_per_block=4, max_blocks=4, reuse=True)
    prompt = [7] * 9
    running = kv.start(prompt)
    other = kv.start(prompt)
    assert other.reused == 2
    assert kv.stats().used_blocks == 4  # 2 shared keyed blocks + one partial block each
    assert not kv.can_start([8] * 9)
    kv.release(running, prompt)
    kv.release(other, prompt)
    assert kv.can_start([8] * 9)


class _Sink:
    def __init__(self) -> None:
        self.tensors: list[dict[str, np.ndarray]] = []
        self.done = threading.Event()

    def is_cancelled(self) -> bool:
        return False

    def send(self, tensors: Any, *, final: bool, error: str | None = None) -> None:
        assert error is None
        if tensors is not None:
            self.tensors.append(tensors)
        if final:
            self.done.set()


def _run(loop: Any, prompt: list[int]) -> tuple[dict[str, np.ndarray], float]:
    sink = _Sink()
    started = time.monotonic()
    loop.submit(
        engine.RequestGroup(
            prompts=[prompt],
            params=[engine.SamplingParams(max_new_tokens=2)],
            options=engine.OutputOptions(return_perf_metrics=True, exclude_input=True),
            sink=sink,
            declared_outputs=PERF,
        )
    )
    assert sink.done.wait(30)
    return sink.tensors[-1], time.monotonic() - started


def test_the_synthetic_engine_reports_reuse_and_prefills_only_uncached_tokens() -> None:
    kv = engine.KvCacheManager(tokens_per_block=16, max_blocks=64, reuse=True)
    loop = engine.Engine(
        runner=None, synthetic_candidates=[5, 6, 7], kv_cache=kv, synthetic_prefill_s_per_token=0.004
    )
    loop.start()
    try:
        prompt = list(range(100, 164))  # 64 tokens: 4 blocks, 3 reusable
        cold, cold_s = _run(loop, prompt)
        warm, warm_s = _run(loop, prompt)
    finally:
        loop.shutdown()
    assert int(cold["kv_cache_reused_blocks"][0, 0]) == 0
    assert int(warm["kv_cache_reused_blocks"][0, 0]) == 3
    # 4 prompt blocks and one for the generated tokens; reused ones are not new.
    assert int(warm["kv_cache_alloc_total_blocks"][0, 0]) == 5
    assert int(warm["kv_cache_alloc_new_blocks"][0, 0]) == 2
    assert warm["kv_cache_reused_blocks"].dtype == np.int32
    # 64 uncached tokens cost 256 ms, 16 cost 64 ms.
    assert cold_s >= 0.25
    assert warm_s < cold_s
