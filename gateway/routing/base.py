"""What every routing policy sees: the candidate endpoints' load and what the request says about itself."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class Loaded(Protocol):
    """An endpoint as a policy sees it: an identity and its requests in flight from this gateway."""

    @property
    def url(self) -> str: ...

    @property
    def outstanding(self) -> int: ...


E = TypeVar("E", bound=Loaded)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a request tells the router: its prompt's token ids (empty when not tokenized), the
    engine's KV cache block size (None: unknown) and an affinity key keeping a conversation on one
    endpoint (prompt_cache_key, a session header, the end user), and the LoRA adapter's task id
    (the engine keys KV blocks by it, and an endpoint that holds the adapter needs no reload)."""

    token_ids: Sequence[int] = ()
    block_size: int | None = None
    affinity: str | None = None
    adapter: int | None = None


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    # Block size when the model does not state its engine's (TensorRT-LLM's default).
    block_size: int = 32
    # Per endpoint: block hashes remembered at most, and for how long.
    index_blocks: int = 65536
    ttl_s: float = 600.0
    # Prefix routing gives way to the least loaded endpoint when its choice has more than
    # `load_margin` requests in flight beyond the least loaded one and, with the request, more than
    # `load_factor` times the mean. The margin alone does not scale: 8 let one endpoint take 1.6-2x
    # the mean requests at 24 in flight (make bench-routing, skewed); a factor of 1.25 gave way so
    # often that the shared-prefix workload lost most of its cache hits.
    load_margin: int = 4
    load_factor: float = 1.5
    # Affinity keys remembered at most.
    affinity_keys: int = 65536


class RoutingPolicy(Protocol):
    # Whether it uses the prompt's token ids (the core then tokenizes before sending).
    needs_prompt_ids: bool

    def choose(self, endpoints: Sequence[E], request: RouteRequest) -> E:
        """One of `endpoints` (never empty: all are available) for `request`, which is sent there."""
        ...


def least_loaded(endpoints: Sequence[E]) -> E:
    """The endpoint with the fewest requests in flight (the first such, in the pool's order)."""
    return min(endpoints, key=lambda e: e.outstanding)
