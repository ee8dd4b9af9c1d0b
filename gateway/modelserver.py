"""The model-server protocol on /metrics: the gauges an Inference Gateway endpoint picker (EPP)
reads to choose a pod, named as its `vllm` engine type reads them, one series per served model.

What is counted here (the admission queue and what it let in, and which LoRA adapters those
requests name) is exact and current; what only Triton knows (its own queue, the KV-cache blocks)
comes from its metrics port through `EngineLoads`, read at most once per cache period. A value
nobody knows is left out: the EPP then does without it (docs/deploy/inference-gateway.md).

Names as llm-d/llm-d-router's built-in `vllm` engine config gives them
(pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go and extractor.go at commit
ebab687927f5331c1b39defcb579a07951bce56c; the same in its v0.10.0 release).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from prometheus_client.core import GaugeMetricFamily, Metric

WAITING: Final = "vllm:num_requests_waiting"
RUNNING: Final = "vllm:num_requests_running"
KV_USAGE: Final = "vllm:kv_cache_usage_perc"
CACHE_CONFIG: Final = "vllm:cache_config_info"
LORA_INFO: Final = "vllm:lora_requests_info"
# The labels the EPP reads: block size and GPU blocks from the cache info gauge; the adapter
# lists (comma-separated) and their bound from the LoRA gauge, whose value is the time it last
# changed (the EPP keeps the series with the largest value).
BLOCK_SIZE: Final = "block_size"
NUM_GPU_BLOCKS: Final = "num_gpu_blocks"
MAX_LORA: Final = "max_lora"
RUNNING_ADAPTERS: Final = "running_lora_adapters"
WAITING_ADAPTERS: Final = "waiting_lora_adapters"
# vLLM labels every series with the served model's name.
MODEL_LABEL: Final = "model_name"
# Each family: its labels and what it says (the collector's help text and the metrics reference).
FAMILIES: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    WAITING: (
        (MODEL_LABEL,),
        "Model-server protocol: requests waiting, in the gateway's admission queue and the engine's queue.",
    ),
    RUNNING: (
        (MODEL_LABEL,),
        "Model-server protocol: requests admitted and not waiting in the engine's queue.",
    ),
    KV_USAGE: (
        (MODEL_LABEL,),
        "Model-server protocol: KV-cache usage, 0 to 1 (used blocks over all blocks); absent where the "
        "engine reports none.",
    ),
    CACHE_CONFIG: (
        (MODEL_LABEL, BLOCK_SIZE, NUM_GPU_BLOCKS),
        "Model-server protocol: the engine's KV-cache block size in tokens and its number of blocks, "
        "in labels (value 1); absent where the engine reports neither.",
    ),
    LORA_INFO: (
        (MODEL_LABEL, MAX_LORA, WAITING_ADAPTERS, RUNNING_ADAPTERS),
        "Model-server protocol: the LoRA adapters of admitted and of waiting requests (comma-separated) "
        "and the most the engine holds at once, in labels; the value is when the lists last changed "
        "(Unix time). Only for models whose engine takes adapters.",
    ),
}


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a Triton model reports of itself on the metrics port (None: not reported)."""

    waiting: float | None = None
    kv_used_blocks: float | None = None
    kv_max_blocks: float | None = None
    kv_fraction: float | None = None
    tokens_per_block: float | None = None

    @property
    def kv_usage(self) -> float | None:
        """Used blocks over all blocks, in [0, 1]; the backend's own fraction where the counts are missing."""
        if self.kv_used_blocks is not None and self.kv_max_blocks:
            value = self.kv_used_blocks / self.kv_max_blocks
        elif self.kv_fraction is not None:
            value = self.kv_fraction
        else:
            return None
        return min(1.0, max(0.0, value))


class EngineLoads(Protocol):
    """Triton's side, cached: `refresh()` reads the metrics port unless the last read is recent;
    `loads()` is the last read, by Triton model name."""

    async def refresh(self) -> None: ...

    def loads(self) -> Mapping[str, EngineLoad]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ServedEngine:
    """A served model as the metrics name it, and the Triton models whose load is its load."""

    name: str
    triton_models: tuple[str, ...]
    # Whether it takes LoRA adapters (then it has a LoRA series, empty lists or not).
    lora: bool = False


# A request's place in the counts: its served base model, and its adapter (None: the base model).
LoadKey = tuple[str, str | None]


class ModelLoad:
    """Generation requests per served model (adapter requests under their base model), waiting
    in the admission queue and admitted, and the adapters those requests name. Updated by
    admission in the event loop; read by the collector. A request's key is resolved once, when it
    starts waiting, so an adapter unloaded meanwhile still leaves the counts as it found them."""

    __slots__ = (
        "_adapters_changed",
        "_resolve",
        "_running",
        "_running_adapters",
        "_waiting",
        "_waiting_adapters",
    )

    def __init__(self, resolve: Callable[[str], LoadKey | None]) -> None:
        # A model name as requests give it -> its key; None: not served (the request gets a 404).
        self._resolve = resolve
        self._waiting: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self._waiting_adapters: Counter[tuple[str, str]] = Counter()
        self._running_adapters: Counter[tuple[str, str]] = Counter()
        self._adapters_changed: dict[str, float] = {}

    def key(self, model: object) -> LoadKey | None:
        return self._resolve(model) if isinstance(model, str) else None

    def queued(self, key: LoadKey, delta: int) -> None:
        self._count(key, delta, self._waiting, self._waiting_adapters)

    def running(self, key: LoadKey, delta: int) -> None:
        self._count(key, delta, self._running, self._running_adapters)

    def _count(
        self, key: LoadKey, delta: int, requests: Counter[str], adapters: Counter[tuple[str, str]]
    ) -> None:
        base, adapter = key
        requests[base] += delta
        if requests[base] <= 0:
            del requests[base]
        if adapter is not None:
            pair = (base, adapter)
            before = adapters[pair] > 0
            adapters[pair] += delta
            after = adapters[pair] > 0
            if not after:
                del adapters[pair]
            if before != after:
                self._adapters_changed[base] = time.time()

    def waiting(self, base: str) -> int:
        return self._waiting.get(base, 0)

    def admitted(self, base: str) -> int:
        return self._running.get(base, 0)

    def adapters(self, base: str) -> tuple[list[str], list[str], float | None]:
        """Adapters with requests admitted, adapters with requests only waiting, and when either list
        last changed."""
        running = sorted(a for (b, a) in self._running_adapters if b == base)
        waiting = sorted(a for (b, a) in self._waiting_adapters if b == base and a not in running)
        return running, waiting, self._adapters_changed.get(base)


class ModelServerCollector:
    """The model-server gauges, computed at each scrape from `ModelLoad` and the cached `EngineLoads`.

    Requests waiting: the admission queue plus what the engine reports queued. Requests running:
    admitted and not waiting in the engine's own queue. KV-cache usage, block size and GPU blocks:
    the engine's, when it reports them. LoRA: the adapters of admitted and of waiting requests,
    and `max_lora` when configured (the engine's LoRA cache in adapters)."""

    def __init__(
        self,
        load: ModelLoad,
        served: Callable[[], list[ServedEngine]],
        engines: EngineLoads | None,
        *,
        max_lora: int | None,
    ) -> None:
        self._load = load
        self._served = served
        self._engines = engines
        self._max_lora = max_lora
        self._started = time.time()

    async def refresh(self) -> None:
        if self._engines is not None:
            await self._engines.refresh()

    async def close(self) -> None:
        if self._engines is not None:
            await self._engines.close()

    def _engine_load(self, served: ServedEngine, served_count: int) -> EngineLoad:
        loads = self._engines.loads() if self._engines is not None else {}
        for name in served.triton_models:
            if name in loads:
                return loads[name]
        # One served model over one TensorRT-LLM model whose name the gateway did not learn (the
        # ensemble route calls the ensemble): that model's load is this model's.
        if served_count == 1 and len(loads) == 1:
            return next(iter(loads.values()))
        return EngineLoad()

    def describe(self) -> list[Metric]:
        # Describing without collecting: registering must not read Triton.
        return [_family(name) for name in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        served = self._served()
        waiting, running, kv, cache, lora = (_family(name) for name in FAMILIES)
        for model in served:
            engine = self._engine_load(model, len(served))
            queued_in_engine = max(0.0, engine.waiting or 0.0)
            admitted = self._load.admitted(model.name)
            waiting.add_metric([model.name], self._load.waiting(model.name) + queued_in_engine)
            running.add_metric([model.name], max(0.0, admitted - queued_in_engine))
            usage = engine.kv_usage
            if usage is not None:
                kv.add_metric([model.name], usage)
            if engine.tokens_per_block or engine.kv_max_blocks:
                cache.add_metric(
                    [model.name, _integer(engine.tokens_per_block), _integer(engine.kv_max_blocks)], 1.0
                )
            if model.lora:
                active, pending, changed = self._load.adapters(model.name)
                max_lora = "" if self._max_lora is None else str(self._max_lora)
                lora.add_metric(
                    [model.name, max_lora, ",".join(pending), ",".join(active)], changed or self._started
                )
        yield waiting
        yield running
        if kv.samples:
            yield kv
        if cache.samples:
            yield cache
        if lora.samples:
            yield lora


def _family(name: str) -> GaugeMetricFamily:
    labels, text = FAMILIES[name]
    return GaugeMetricFamily(name, text, labels=list(labels))


def _integer(value: float | None) -> str:
    # The EPP parses these labels as integers; an unknown one is empty, which it skips.
    return "" if not value else str(int(value))
