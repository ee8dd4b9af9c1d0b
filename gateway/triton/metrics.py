"""Triton's metrics port, read for the model-server protocol (gateway.modelserver): the TensorRT-LLM
backend's queue and KV-cache gauges per Triton model, summed over the gateway's Triton endpoints.

Read at most once per `cache_s` and only when /metrics is asked (one read at a time; scrapes in
between get the last read), parsed off the event loop. A Triton that does not answer leaves the
last read in place for a short while, then nothing: a stale KV figure steers the EPP wrong.

Families and labels as the C++ backend (v0.18.0 on) and the CPU reference engine export them:
`nv_trt_llm_request_metrics{request_type="waiting"}` and
`nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used|max|fraction|tokens_per"}`, each with
Triton's `model` label.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.modelserver import EngineLoad

logger = logging.getLogger(__name__)

REQUESTS: str = "nv_trt_llm_request_metrics"
KV_BLOCKS: str = "nv_trt_llm_kv_cache_block_metrics"
# A read older than this many cache periods is dropped rather than reported.
STALE_PERIODS = 5


@dataclass(slots=True)
class _Sums:
    values: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.values[key] = self.values.get(key, 0.0) + value


def parse(texts: Sequence[str]) -> dict[str, EngineLoad]:
    """Each endpoint's exposition text -> the load per Triton model, summed over the endpoints
    (KV usage as used over all blocks; the block size is the engine's, the same everywhere)."""
    sums: dict[str, _Sums] = {}
    fractions: dict[str, list[float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in (REQUESTS, KV_BLOCKS):
                continue
            for sample in family.samples:
                model = sample.labels.get("model")
                if model is None:
                    continue
                entry = sums.setdefault(model, _Sums())
                if family.name == REQUESTS:
                    if sample.labels.get("request_type") == "waiting":
                        entry.add("waiting", sample.value)
                    continue
                kind = sample.labels.get("kv_cache_block_type")
                if kind == "fraction":
                    fractions.setdefault(model, []).append(sample.value)
                elif kind in ("used", "max"):
                    entry.add(kind, sample.value)
                elif kind == "tokens_per":
                    entry.values["tokens_per"] = sample.value
    loads = {}
    for model, entry in sums.items():
        v = entry.values
        share = fractions.get(model)
        loads[model] = EngineLoad(
            waiting=v.get("waiting"),
            kv_used_blocks=v.get("used"),
            kv_max_blocks=v.get("max"),
            kv_fraction=sum(share) / len(share) if share else None,
            tokens_per_block=v.get("tokens_per"),
        )
    # Models without any of these families (the llmapi model, encoders) report nothing.
    return {m: load for m, load in loads.items() if load != EngineLoad()}


class TritonMetrics:
    """The `EngineLoads` of gateway.modelserver over Triton metrics URLs (http://HOST:8002/metrics)."""

    def __init__(self, urls: Sequence[str], *, cache_s: float, timeout_s: float = 2.0) -> None:
        self._urls = list(urls)
        self._cache_s = cache_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._loads: dict[str, EngineLoad] = {}
        self._read_at = -float("inf")
        self._tried_at = -float("inf")
        self._lock = asyncio.Lock()

    def loads(self) -> Mapping[str, EngineLoad]:
        if time.monotonic() - self._read_at > STALE_PERIODS * max(self._cache_s, 1.0):
            return {}
        return self._loads

    async def refresh(self) -> None:
        if time.monotonic() - self._tried_at < self._cache_s:
            return
        async with self._lock:
            if time.monotonic() - self._tried_at < self._cache_s:
                return  # another scrape read it meanwhile
            self._tried_at = time.monotonic()
            try:
                texts = await asyncio.gather(*(self._get(url) for url in self._urls))
                self._loads = await asyncio.to_thread(parse, texts)
                self._read_at = time.monotonic()
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                logger.warning("Triton metrics: %s unreadable (%s)", ", ".join(self._urls), exc)

    async def _get(self, url: str) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.get(url) as response:
            response.raise_for_status()
            return await response.text()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
