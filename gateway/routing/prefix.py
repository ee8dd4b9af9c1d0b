"""`prefix`: KV-cache-aware routing. A request goes to the endpoint that most recently got the
longest prefix of its prompt, so the engine there reuses the KV cache blocks it already holds.

The prompt's token ids are cut into blocks of the engine's block size and hashed as a chain (block
i's hash covers blocks 0..i, as TensorRT-LLM and vLLM key reusable blocks), so a match of k hashes
is a shared prefix of k whole blocks. Each endpoint has a bounded index of the hashes sent there
(least recently used out first, forgotten after a TTL: the engine evicts too). A load guard gives
way to the least loaded endpoint when the best match is busier than it by more than a margin and
busier than the mean by a factor (a popular prefix then spreads over several endpoints), and an
affinity key (prompt_cache_key, session, user) keeps a conversation where it started unless another
endpoint holds more of its prompt. A LoRA request's blocks are keyed by its adapter (the engine keys
its KV blocks by task id), and among equal matches an endpoint that recently served the adapter
(so holds it in its LoRA cache) is preferred, within the same load guard.
"""

from __future__ import annotations

import collections
import hashlib
import struct
import time
from collections.abc import Callable, Sequence

from gateway.routing.base import E, RouteRequest, RoutingSettings, least_loaded
from gateway.text.ids import TokenIds


def block_hashes(token_ids: Sequence[int], block_size: int, adapter: int | None = None) -> list[int]:
    """Chained 64-bit hashes of the whole blocks of `token_ids` (a partial last block has none),
    the chain started from the LoRA adapter's task id (0: the base model). Block i's hash is the
    BLAKE2b-64 of its parent's hash (8 bytes) and its ids (4 bytes each), all little-endian."""
    whole = len(token_ids) - len(token_ids) % block_size
    if not whole:
        return []
    # Every id packed once (TokenIds: a copy of their array's bytes), then hashed block by block.
    if isinstance(token_ids, TokenIds):
        raw = token_ids.array[:whole].astype("<i4", copy=False).tobytes()
    else:
        raw = struct.pack(f"<{whole}i", *token_ids[:whole])
    view = memoryview(raw)
    step = 4 * block_size
    hashes: list[int] = []
    parent = adapter or 0
    blake2b = hashlib.blake2b
    for start in range(0, len(raw), step):
        digest = blake2b(parent.to_bytes(8, "little"), digest_size=8)
        digest.update(view[start : start + step])
        parent = int.from_bytes(digest.digest(), "little")
        hashes.append(parent)
    return hashes


def adapter_marker(task_id: int) -> int:
    """The index entry saying an endpoint recently served a LoRA adapter (never a block's hash:
    another digest size)."""
    return int.from_bytes(hashlib.blake2b(struct.pack("<Q", task_id), digest_size=7).digest(), "little")


class BlockIndex:
    """The block hashes recently sent to one endpoint: at most `capacity`, each for `ttl_s`."""

    def __init__(self, capacity: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._capacity = capacity
        self._ttl = ttl_s
        self._clock = clock
        # hash -> when it expires, least recently sent first.
        self._entries: collections.OrderedDict[int, float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, hashes: Sequence[int]) -> None:
        expires = self._clock() + self._ttl
        entries = self._entries
        for h in hashes:
            entries[h] = expires
            entries.move_to_end(h)
        while len(entries) > self._capacity:
            entries.popitem(last=False)

    def matched_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading hashes are here and unexpired."""
        now = self._clock()
        count = 0
        for h in hashes:
            expires = self._entries.get(h)
            if expires is None:
                break
            if expires <= now:
                del self._entries[h]
                break
            count += 1
        return count


class PrefixAware:
    needs_prompt_ids = True

    def __init__(self, settings: RoutingSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._indexes: dict[str, BlockIndex] = {}
        # affinity key -> (endpoint url, expiry), least recently used first.
        self._affinity: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()

    def index(self, url: str) -> BlockIndex:
        index = self._indexes.get(url)
        if index is None:
            index = BlockIndex(self._settings.index_blocks, self._settings.ttl_s, self._clock)
            self._indexes[url] = index
        return index

    def choose(self, endpoints: Sequence[E], request: RouteRequest) -> E:
        size = request.block_size or self._settings.block_size
        hashes = block_hashes(request.token_ids, size, request.adapter) if len(request.token_ids) else []
        marker = adapter_marker(request.adapter) if request.adapter else None
        matches = [self.index(e.url).matched_blocks(hashes) for e in endpoints]
        best = max(matches)
        candidates = [e for e, m in zip(endpoints, matches, strict=True) if m == best]
        if marker is not None:
            # Among equal matches, those holding the adapter (no weights to send, no eviction).
            holding = [e for e in candidates if self.index(e.url).matched_blocks((marker,))]
            candidates = holding or candidates
        # The longest match; among equals, the least loaded.
        chosen = min(candidates, key=lambda e: e.outstanding)
        pinned = self._pinned(endpoints, request.affinity)
        if pinned is not None and matches[endpoints.index(pinned)] == best:
            chosen = pinned
        lightest = least_loaded(endpoints)
        if self._overloaded(chosen, lightest, endpoints):
            chosen = lightest
        self.index(chosen.url).add(hashes if marker is None else [marker, *hashes])
        if request.affinity is not None:
            self._remember(request.affinity, chosen.url)
        return chosen

    def _overloaded(self, chosen: E, lightest: E, endpoints: Sequence[E]) -> bool:
        """Whether the best match is too busy to wait on: more than `load_margin` requests beyond
        the least loaded endpoint (below that a cache hit is worth the wait) and, counting this
        request, above `load_factor` times the mean load (so one hot prefix cannot take every
        request; the least loaded endpoint that gets it instead then holds it too, and the two
        share it from then on)."""
        if chosen.outstanding - lightest.outstanding <= self._settings.load_margin:
            return False
        mean = (sum(e.outstanding for e in endpoints) + 1) / len(endpoints)
        return chosen.outstanding + 1 > self._settings.load_factor * mean

    def _pinned(self, endpoints: Sequence[E], key: str | None) -> E | None:
        if key is None:
            return None
        entry = self._affinity.get(key)
        if entry is None:
            return None
        url, expires = entry
        if expires <= self._clock():
            del self._affinity[key]
            return None
        return next((e for e in endpoints if e.url == url), None)

    def _remember(self, key: str, url: str) -> None:
        self._affinity[key] = (url, self._clock() + self._settings.ttl_s)
        self._affinity.move_to_end(key)
        while len(self._affinity) > self._settings.affinity_keys:
            self._affinity.popitem(last=False)
