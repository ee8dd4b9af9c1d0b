"""A LoRA adapter served as a model: the base model's engine with the adapter on every request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

from gateway.core.models import ModelRegistry, ModelRuntime
from gateway.engine import (
    Engine,
    EngineInfo,
    GenerationDelta,
    GenerationRequest,
    LoraRequest,
    LoraRoutes,
    LoraTensors,
)
from gateway.errors import EngineUnavailableError, GatewayError, InvalidRequestError, NotFoundError
from gateway.lora import (
    Adapter,
    AdapterError,
    AdapterStore,
    check_name,
    check_targets,
    confined,
    read_adapter,
)
from gateway.metrics import GatewayMetrics


class AdapterEngine:
    """The Engine protocol for one adapter over its base model's engine (or, where the base
    model's route passes no LoRA inputs on, the engine that takes them)."""

    def __init__(
        self, base: Engine, adapter: Adapter, store: AdapterStore, metrics: GatewayMetrics | None
    ) -> None:
        self._base = base
        self.adapter = adapter
        self._store = store
        self._target: Engine | None = None
        self._task_id: int | None = None
        self._lock = asyncio.Lock()
        self._on_miss = None if metrics is None else metrics.lora_cache_misses.labels(adapter.name).inc

    @property
    def info(self) -> EngineInfo:
        if self._target is None:
            raise EngineUnavailableError(f"adapter {self.adapter.name!r} is not ready yet")
        return self._target.info

    async def ensure_ready(self) -> None:
        if self._target is not None and self._task_id is not None:
            return
        async with self._lock:
            await self._base.ensure_ready()
            target = await self._base.lora_engine() if isinstance(self._base, LoraRoutes) else self._base
            info = target.info
            if not info.lora:
                raise InvalidRequestError(
                    f"The model `{self.adapter.base}` is served by a Triton model that takes no LoRA "
                    f"adapters ({info.model} declares no LoRA inputs), so `{self.adapter.name}` "
                    "cannot be served.",
                    param="model",
                    code="lora_not_supported",
                )
            if info.lora_by_server_path and self.adapter.server_path is None:
                raise InvalidRequestError(
                    f"The model `{self.adapter.base}` loads LoRA adapters itself from a path on the Triton "
                    f"server: give `{self.adapter.name}` its server_path (--lora NAME=PATH,server_path=...).",
                    param="model",
                    code="lora_needs_server_path",
                )
            tensors = await self._read()
            try:
                check_targets(self.adapter.name, tensors, info.lora_target_modules)
            except AdapterError as exc:
                raise InvalidRequestError(str(exc), param="model", code="lora_adapter_invalid") from None
            self._target = target
            self._task_id = tensors.task_id

    async def _read(self) -> LoraTensors:
        try:
            tensors = await asyncio.to_thread(self._store.get, self.adapter)
        except AdapterError as exc:
            raise InvalidRequestError(
                f"The LoRA adapter `{self.adapter.name}` cannot be read: {exc}",
                param="model",
                code="lora_adapter_invalid",
            ) from None
        # The files may have changed since: the id follows the content.
        self._task_id = tensors.task_id
        return tensors

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        if self._target is None or self._task_id is None:
            raise EngineUnavailableError(f"adapter {self.adapter.name!r} is not ready yet")
        lora = LoraRequest(
            name=self.adapter.name,
            task_id=self._task_id,
            tensors=self._read,
            server_path=self.adapter.server_path,
            on_miss=self._on_miss,
        )
        return self._target.generate(replace(request, lora=lora))

    async def is_ready(self) -> bool:
        return await self._base.is_ready()

    async def close(self) -> None:
        # The base model's engine is closed by its own runtime.
        return None


def adapter_runtime(
    base: ModelRuntime, adapter: Adapter, store: AdapterStore, metrics: GatewayMetrics | None, created: int
) -> ModelRuntime:
    """The model clients reach by the adapter's name: the base model's tokenizer and settings,
    its engine with the adapter."""
    engine = AdapterEngine(base.engine, adapter, store, metrics)
    return ModelRuntime(
        base.config,
        base.tokenizer,
        engine,
        created,
        adapter=adapter.name,
        parent=base.name,
        reply_encoding=base.reply_encoding,
    )


class Adapters:
    """Adapters as the app serves them: those configured at start-up and those loaded at run time
    (POST /v1/load_lora_adapter), over one store of their tensors."""

    def __init__(self, registry: ModelRegistry, store: AdapterStore, metrics: GatewayMetrics | None) -> None:
        self.registry = registry
        self.store = store
        self._metrics = metrics

    def add(self, adapter: Adapter) -> ModelRuntime:
        base = self.registry.base(adapter.base)
        if base is None:
            raise InvalidRequestError(f"The base model `{adapter.base}` is not served.", param="model")
        runtime = adapter_runtime(base, adapter, self.store, self._metrics, int(time.time()))
        self.registry.add_adapter(runtime)
        return runtime

    def remove(self, name: str) -> bool:
        self.store.forget(name)
        return self.registry.remove_adapter(name) is not None

    async def load(
        self, name: str, path_text: str, base: str | None, roots: list[Path], replace: bool
    ) -> None:
        """POST /v1/load_lora_adapter: an adapter from inside `roots`, read and checked before it
        is served (a bad one changes nothing)."""
        try:
            check_name(name)
        except AdapterError as exc:
            raise InvalidRequestError(str(exc), param="lora_name") from None
        try:
            path = confined(path_text, roots)
        except AdapterError as exc:
            raise InvalidRequestError(str(exc), param="lora_path") from None
        bases = [m.name for m in self.registry]
        if base is None:
            if len(bases) != 1:
                raise InvalidRequestError(
                    "Several models are served: name the adapter's base_model.", param="base_model"
                )
            base = bases[0]
        if self.registry.base(base) is None:
            raise InvalidRequestError(f"The base model `{base}` is not served.", param="base_model")
        if self.registry.base(name) is not None:
            raise InvalidRequestError(
                f"`{name}` is the name of a served model, not free for an adapter.", param="lora_name"
            )
        if self.registry.adapter(name) is not None and not replace:
            raise InvalidRequestError(
                f"The lora adapter '{name}' has already been loaded.", param="lora_name", code="lora_exists"
            )
        adapter = Adapter(name, base, path)
        try:
            await asyncio.to_thread(read_adapter, path)
        except AdapterError as exc:
            raise InvalidRequestError(str(exc), param="lora_path", code="lora_adapter_invalid") from None
        previous = self.registry.adapter(name)
        self.store.forget(name)
        runtime = self.add(adapter)
        try:
            await runtime.engine.ensure_ready()
        except GatewayError:
            self.remove(name)
            if previous is not None:
                self.registry.add_adapter(previous)
            raise

    def unload(self, name: str) -> None:
        """POST /v1/unload_lora_adapter."""
        if not self.remove(name):
            raise NotFoundError(f"The lora adapter '{name}' cannot be found.", param="lora_name")
