"""Readiness of every served model, cached briefly so probes do not hammer Triton."""

from __future__ import annotations

import asyncio
import time

from gateway.core.models import ModelRegistry


class Readiness:
    def __init__(self, registry: ModelRegistry, cache_s: float) -> None:
        self._registry = registry
        self._cache_s = cache_s
        self._at = float("-inf")
        self._last: dict[str, bool] = {}
        self._lock = asyncio.Lock()
        self.reasons: dict[str, str] = {}

    async def check(self) -> dict[str, bool]:
        async with self._lock:
            if time.monotonic() - self._at < self._cache_s:
                return self._last
            models = list(self._registry)
            results = await asyncio.gather(*(m.engine.is_ready() for m in models))
            self._last = {m.name: ok for m, ok in zip(models, results, strict=True)}
            # Why a model is not ready, where its engine can tell (Triton's URL and gRPC's reason).
            self.reasons = {
                m.name: reason
                for m, ok in zip(models, results, strict=True)
                if not ok and (reason := getattr(m.engine, "unready_reason", None))
            }
            encoders = self._registry.encoders
            if encoders:
                ready = await asyncio.gather(*(e.encoder.is_ready() for e in encoders))
                self._last.update({e.name: ok for e, ok in zip(encoders, ready, strict=True)})
            self._at = time.monotonic()
            return self._last
