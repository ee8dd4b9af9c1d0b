"""Routing policies: chained block hashes, the per-endpoint index's bounds, prefix matching, the
load guard, affinity, round robin and the registry."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.config import Settings
from gateway.routing.base import RouteRequest, RoutingSettings
from gateway.routing.prefix import BlockIndex, PrefixAware, block_hashes
from gateway.routing.registry import POLICY_NAMES, make_policy


@dataclass
class Ep:
    url: str
    outstanding: int = 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_same_prefix_gives_the_same_chain() -> None:
    ids = list(range(100))
    assert block_hashes(ids, 16) == block_hashes(list(ids), 16)
    assert len(block_hashes(ids, 16)) == 6  # the partial last block has no hash
    # A longer prompt with the same start shares every hash of the shorter one.
    assert block_hashes([*ids, 7, 8, 9], 16)[:6] == block_hashes(ids, 16)


def test_a_one_token_change_changes_every_later_block() -> None:
    ids = list(range(100))
    changed = [*ids[:40], 12345, *ids[41:]]
    before, after = block_hashes(ids, 16), block_hashes(changed, 16)
    assert before[:2] == after[:2]
    assert all(a != b for a, b in zip(before[2:], after[2:], strict=True))


def test_equal_blocks_at_different_depths_hash_differently() -> None:
    hashes = block_hashes([5] * 32, 16)
    assert hashes[0] != hashes[1]


def test_the_index_forgets_the_least_recently_sent_beyond_its_capacity() -> None:
    index = BlockIndex(capacity=4, ttl_s=60)
    first, second = block_hashes(list(range(48)), 16), block_hashes(list(range(100, 148)), 16)
    index.add(first)
    index.add(second)
    assert len(index) == 4
    # first's two oldest hashes went: its prefix no longer matches from the start.
    assert index.matched_blocks(first) == 0
    assert index.matched_blocks(second) == 3


def test_the_index_forgets_hashes_after_their_ttl() -> None:
    clock = Clock()
    index = BlockIndex(capacity=100, ttl_s=10, clock=clock)
    hashes = block_hashes(list(range(64)), 16)
    index.add(hashes)
    clock.now += 9
    assert index.matched_blocks(hashes) == 4
    index.add(hashes[:2])  # sent again: refreshed
    clock.now += 5
    assert index.matched_blocks(hashes) == 2
    clock.now += 20
    assert index.matched_blocks(hashes) == 0


def _prefix(**kwargs: float) -> PrefixAware:
    return PrefixAware(RoutingSettings(**kwargs))  # type: ignore[arg-type]


def test_prefix_routing_sends_a_shared_prefix_where_it_went_before() -> None:
    policy = _prefix(load_margin=8)
    a, b, c = Ep("a"), Ep("b"), Ep("c")
    system = list(range(64))
    first = policy.choose([a, b, c], RouteRequest([*system, 1, 2, 3], 16))
    first.outstanding += 1
    # Other users with the same long system prompt follow it, though it is now the busiest.
    for user in range(5):
        chosen = policy.choose([a, b, c], RouteRequest([*system, 100 + user], 16))
        assert chosen is first
    # A prompt sharing nothing goes to the least loaded.
    other = policy.choose([a, b, c], RouteRequest(list(range(500, 600)), 16))
    assert other is not first


def test_the_longest_match_wins() -> None:
    policy = _prefix()
    a, b = Ep("a"), Ep("b")
    doc = list(range(128))
    policy.index("a").add(block_hashes(doc[:32], 16))
    policy.index("b").add(block_hashes(doc[:96], 16))
    assert policy.choose([a, b], RouteRequest(doc, 16)).url == "b"


def test_the_load_guard_falls_back_to_the_least_loaded_endpoint() -> None:
    policy = _prefix(load_margin=2)
    a, b = Ep("a", outstanding=0), Ep("b", outstanding=0)
    prompt = list(range(64))
    policy.index("b").add(block_hashes(prompt, 16))
    b.outstanding = 2
    assert policy.choose([a, b], RouteRequest(prompt, 16)) is b  # within the margin
    b.outstanding = 3
    assert policy.choose([a, b], RouteRequest(prompt, 16)) is a  # beyond it


def test_beyond_the_margin_the_best_match_keeps_a_request_while_within_the_load_factor() -> None:
    policy = _prefix(load_margin=2, load_factor=1.25)
    eps = [Ep("a", 10), Ep("b", 10), Ep("c", 10), Ep("d", 7)]
    prompt = list(range(64))
    policy.index("a").add(block_hashes(prompt, 16))
    # 3 beyond the least loaded, but 11 is within 1.25x the mean of 38 / 4 with this request.
    assert policy.choose(eps, RouteRequest(prompt, 16)).url == "a"
    eps[0].outstanding = 12
    # 13 > 1.25 * 40 / 4: the least loaded takes it.
    assert policy.choose(eps, RouteRequest(prompt, 16)).url == "d"


def test_a_hot_prefix_spreads_over_endpoints_instead_of_loading_one() -> None:
    policy = _prefix(load_margin=2, load_factor=1.25)
    eps = [Ep(name) for name in "abcd"]
    hot = list(range(256))
    # 24 requests in flight at once, all on one prefix: no endpoint gets more than 1.25x the mean
    # (6); those that took the overflow hold the prefix too and share it from then on.
    for _ in range(8):
        policy.choose(eps, RouteRequest(hot, 16)).outstanding += 1
    # Within the margin the holder keeps it; beyond, the least loaded takes the overflow.
    assert [e.outstanding for e in eps] == [3, 3, 2, 0]
    for _ in range(16):
        policy.choose(eps, RouteRequest(hot, 16)).outstanding += 1
    assert max(e.outstanding for e in eps) <= 1.25 * 6
    holders = [e for e in eps if policy.index(e.url).matched_blocks(block_hashes(hot, 16)) == 16]
    assert len(holders) == 4


def test_affinity_keeps_a_conversation_on_its_endpoint() -> None:
    policy = _prefix()
    a, b = Ep("a"), Ep("b")
    first = policy.choose([a, b], RouteRequest([1, 2, 3], 16, affinity="session:x"))
    first.outstanding += 2
    # Short prompts (no whole block) of the same session follow it though it is busier.
    for turn in range(3):
        assert policy.choose([a, b], RouteRequest([4, 5, turn], 16, affinity="session:x")) is first
    # Without the key: the least loaded.
    assert policy.choose([a, b], RouteRequest([4, 5, 6], 16)) is not first


def test_the_block_size_falls_back_to_the_setting_when_the_engine_has_none() -> None:
    policy = _prefix(block_size=8)
    a, b = Ep("a"), Ep("b")
    policy.index("b").add(block_hashes(list(range(16)), 8))
    assert policy.choose([a, b], RouteRequest(list(range(20)), None)) is b


def test_round_robin_takes_turns_and_least_outstanding_takes_the_least_loaded() -> None:
    a, b, c = Ep("a", 5), Ep("b", 0), Ep("c", 1)
    rr = make_policy("round_robin")
    assert [rr.choose([a, b, c], RouteRequest()).url for _ in range(4)] == ["a", "b", "c", "a"]
    assert make_policy("least_outstanding").choose([a, b, c], RouteRequest()) is b


def test_the_config_takes_its_allowed_policies_from_the_registry() -> None:
    assert POLICY_NAMES == ("least_outstanding", "round_robin", "prefix")
    assert Settings(routing_policy="prefix").routing_policy == "prefix"
    with pytest.raises(ValueError, match="least_outstanding, round_robin, prefix"):
        Settings(routing_policy="random")
    with pytest.raises(ValueError, match="routing policy must be one of"):
        make_policy("random")


def test_an_adapters_blocks_are_its_own() -> None:
    ids = list(range(64))
    assert block_hashes(ids, 16, adapter=7) != block_hashes(ids, 16)
    assert block_hashes(ids, 16, adapter=7) != block_hashes(ids, 16, adapter=8)
    assert block_hashes(ids, 16, adapter=None) == block_hashes(ids, 16)
    policy = _prefix()
    a, b = Ep("a"), Ep("b")
    assert policy.choose([a, b], RouteRequest(ids, 16)) is a
    # The same prompt under an adapter shares no blocks with the base model's: the least loaded.
    a.outstanding = 1
    assert policy.choose([a, b], RouteRequest(ids, 16, adapter=7)) is b


def test_an_endpoint_holding_the_adapter_is_preferred_within_the_load_guard() -> None:
    policy = _prefix()
    a, b = Ep("a"), Ep("b")
    assert policy.choose([a, b], RouteRequest([1, 2, 3], 16, adapter=9)) is a
    # A new prompt (no block matches anywhere) for the same adapter: where the adapter is.
    a.outstanding, b.outstanding = 3, 0
    assert policy.choose([a, b], RouteRequest(list(range(100, 140)), 16, adapter=9)) is a
    # Another adapter goes to the least loaded.
    assert policy.choose([a, b], RouteRequest(list(range(200, 240)), 16, adapter=10)) is b
    # The load guard still gives way.
    a.outstanding = 20
    assert policy.choose([a, b], RouteRequest(list(range(300, 340)), 16, adapter=9)) is b


def _reference_hashes(ids: list[int], block_size: int, adapter: int = 0) -> list[int]:
    # The chain as written down: BLAKE2b-64 of the parent (u64) and the block's ids (i32), little-endian.
    import hashlib
    import struct

    out, parent = [], adapter
    for start in range(0, len(ids) - len(ids) % block_size, block_size):
        block = struct.pack(f"<Q{block_size}i", parent, *ids[start : start + block_size])
        parent = int.from_bytes(hashlib.blake2b(block, digest_size=8).digest(), "little")
        out.append(parent)
    return out


@pytest.mark.parametrize("length", [0, 15, 16, 17, 64, 1000])
def test_block_hashes_of_lists_tuples_and_token_id_arrays_are_the_written_chain(length: int) -> None:
    from gateway.text.ids import TokenIds

    ids = [(i * 7919) % 150_000 - (5 if i % 13 == 0 else 0) for i in range(length)]
    want = _reference_hashes(ids, 16, adapter=3)
    assert block_hashes(ids, 16, 3) == want
    assert block_hashes(tuple(ids), 16, 3) == want
    assert block_hashes(TokenIds(ids), 16, 3) == want
