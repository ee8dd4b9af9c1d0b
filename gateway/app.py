"""create_app(settings) -> FastAPI: the registered APIs over the core; the lifespan opens Triton
connections and tokenizers and registers the services the routes ask for."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from gateway import tracing
from gateway.apis import APIS, error_shape, rate_limit_headers
from gateway.apis.openai.errors import install_error_handlers
from gateway.asyncutil import watch_loop_lag
from gateway.config import ServedModel, Settings
from gateway.core.lora import Adapters
from gateway.core.models import ModelRegistry, ModelRuntime, load_reply_encoding
from gateway.core.readiness import Readiness
from gateway.core.validation import RequestLimits
from gateway.engine import Engine
from gateway.errors import GatewayError
from gateway.http import health
from gateway.http.middleware import (
    AdmissionMiddleware,
    ApiKeyMiddleware,
    BodySizeMiddleware,
    ConnectionRequestLimit,
    ObservabilityMiddleware,
)
from gateway.http.ratelimit import RateLimitMiddleware
from gateway.http.routing import DirectRoutes, generation_paths
from gateway.http.services import Services
from gateway.logs import Repeating
from gateway.lora import Adapter, AdapterStore
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import KeyLimits, Limits, open_limiter
from gateway.text.images import image_expander
from gateway.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

EngineFactory = Callable[[ServedModel], Engine]


async def _introspect_until_ready(
    runtimes: Sequence[ModelRuntime], adapters: Sequence[ModelRuntime] = ()
) -> None:
    """Learn each model's contract as soon as Triton serves it (Triton may start after us), and
    log what each model supports, the same table `gateway check` prints."""
    delay = 0.5
    pending = list(runtimes)
    repeats = {r.name: Repeating() for r in runtimes}
    while pending:
        still = []
        for runtime in pending:
            try:
                await runtime.engine.ensure_ready()
            except GatewayError as exc:
                repeat = repeats[runtime.name]
                if repeat.should_log(exc.message):
                    again = repeat.take_suppressed()
                    logger.warning(
                        "model %s: waiting for Triton: %s%s",
                        runtime.name,
                        exc.message,
                        f" (again {again} times since the last report)" if again else "",
                    )
                still.append(runtime)
        pending = still
        if pending:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    from gateway.check import report, table, terminal_width

    reports = [report(r.config, r.engine.info, None, r.tokenizer) for r in runtimes]
    if reports:
        # Not worded as a ready line: `gateway dev` prints the one ready line, once the port serves.
        logger.info("what each model supports:\n%s", table(reports, terminal_width()))
    for r in reports:
        for warning in r.warnings:
            logger.warning("model %s: %s", r.name, warning)
    # Configured adapters are read now rather than on their first request; one that cannot be
    # served is said here (and again, as a 4xx, to each request for it).
    for runtime in adapters:
        try:
            await runtime.engine.ensure_ready()
        except GatewayError as exc:
            logger.error("LoRA adapter %s cannot be served: %s", runtime.name, exc.message)
        else:
            logger.info(
                "LoRA adapter %s loaded for %s (%s route)",
                runtime.name,
                runtime.parent,
                runtime.engine.info.route,
            )


class TritonEngines:
    """Triton adapters for every served model over one shared pool of Triton endpoints."""

    def __init__(self, settings: Settings, metrics: GatewayMetrics) -> None:
        from gateway.routing.base import RoutingSettings
        from gateway.routing.registry import make_policy
        from gateway.triton.pool import TritonPool

        def on_health(url: str, healthy: bool) -> None:
            metrics.endpoint_healthy.labels(url).set(1 if healthy else 0)

        routing = RoutingSettings(
            block_size=settings.routing_block_size,
            index_blocks=settings.routing_index_blocks,
            ttl_s=settings.routing_ttl_s,
            load_margin=settings.routing_load_margin,
            load_factor=settings.routing_load_factor,
        )
        self.pool = TritonPool(
            settings.triton_url,
            timeout_s=settings.triton_connect_timeout_s,
            http_urls=settings.triton_http_url,
            stream_idle_s=settings.triton_stream_idle_timeout_s or None,
            on_health=on_health,
            policy=make_policy(settings.routing_policy, routing),
            series=metrics.endpoint,
        )

    def __call__(self, model: ServedModel) -> Engine:
        from gateway.triton.models import adapter_for

        return adapter_for(self.pool, model)

    def start(self) -> None:
        self.pool.start()

    async def close(self) -> None:
        await self.pool.close()


def create_app(
    settings: Settings,
    *,
    engine_factory: EngineFactory | None = None,
    tokenizers: Mapping[str, Tokenizer] | None = None,
) -> FastAPI:
    """`tokenizers`: already loaded (the CLI loads them before it binds the port, to refuse a bad
    directory with one line); the others are loaded by the lifespan."""
    metrics = GatewayMetrics()
    loaded = dict(tokenizers or {})
    triton = TritonEngines(settings, metrics) if engine_factory is None else None
    factory: EngineFactory = engine_factory or triton  # type: ignore[assignment]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtimes = []
        for model in settings.models:
            tokenizer = loaded.pop(model.name, None) or Tokenizer(
                model.tokenizer, chat_template_file=model.chat_template
            )
            encoding = load_reply_encoding(model, settings.state_dir)
            runtimes.append(
                ModelRuntime(
                    model,
                    tokenizer,
                    factory(model),
                    int(time.time()),
                    reply_encoding=encoding,
                    expand_images=image_expander(tokenizer.path),
                )
            )
        registry = ModelRegistry(runtimes)
        store = AdapterStore(
            settings.lora_max_bytes, on_load=lambda a: metrics.lora_loads.labels(a.name).inc()
        )
        adapters = Adapters(registry, store, metrics)
        for spec in settings.lora_modules:
            adapters.add(Adapter(spec.name, settings.lora_base(spec), spec.path, spec.server_path))
        services.add(adapters)
        limits = RequestLimits(
            max_n=settings.max_n,
            max_stop_strings=settings.max_stop_strings,
            max_stop_string_length=settings.max_stop_string_length,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_tokens=settings.max_tokens_limit,
            request_timeout_s=settings.request_timeout_s,
            reject_unknown_fields=settings.reject_unknown_fields,
        )
        services.add(registry)
        services.add(Readiness(registry, settings.readiness_cache_s))
        built = [
            api.service.build(registry, limits, metrics, settings) for api in APIS if api.service is not None
        ]
        for service in built:
            services.add(service)
        if triton is not None:
            triton.start()
        introspection = asyncio.create_task(_introspect_until_ready(runtimes, registry.adapters))
        # Threads render and join long prompts (Python code): with a 1 ms switch interval the loop
        # gets the GIL back within a millisecond instead of five.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
        lag = asyncio.create_task(watch_loop_lag(metrics.loop_lag.observe))
        if settings.state_url is not None:
            from gateway.state_server import check

            await check(settings.state_url)
        _freeze_startup_heap()
        try:
            yield
        finally:
            # Back under the collector, so that shutdown (and a test's next app) can free it.
            gc.unfreeze()
            for task in (introspection, lag):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for service in built:
                await service.close()
            for runtime in runtimes:
                await runtime.engine.close()
            if triton is not None:
                await triton.close()
            if limiter is not None:
                await limiter.close()

    app = FastAPI(
        title="TensorRT-LLM OpenAI gateway",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # The gateway makes its own server span, metrics and access line (ObservabilityMiddleware).
        # FastAPI's native OpenTelemetry would add a second span per request once tracing
        # configures a provider, and checks whether it is on for every request otherwise.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    services = Services()
    services.add(settings)
    services.add(metrics)
    app.state.services = services
    install_error_handlers(app, error_shape)
    for api in APIS:
        app.include_router(api.router)
    app.include_router(health.router)
    # Starlette wraps in reverse order of adding: observability outermost, the direct generation
    # routes innermost (after admission, so a request holds its slot while it runs).
    app.add_middleware(DirectRoutes, routes=app.routes, exception_handlers=app.exception_handlers)
    app.add_middleware(
        AdmissionMiddleware,
        max_concurrent=settings.max_concurrent_requests,
        max_queued=settings.max_queued_requests,
        queue_timeout_s=settings.queue_timeout_s,
        metrics=metrics,
        paths=generation_paths(app.routes),
        key_priorities=settings.key_priorities(),
    )
    keys = settings.accepted_keys()
    if keys:
        # Admin keys pass the key check too (the admin routes check them again, alone).
        keys += [k for k in settings.admin_api_keys if k not in keys]
    key_limits = KeyLimits(
        Limits(settings.rate_limit_rpm, settings.rate_limit_tpm),
        {
            k.key: Limits(
                k.rpm if k.rpm is not None else settings.rate_limit_rpm,
                k.tpm if k.tpm is not None else settings.rate_limit_tpm,
            )
            for k in settings.key_limits().values()
        },
    )
    limiter = open_limiter(settings.state_url) if key_limits.configured else None
    if limiter is not None and settings.state_url is None and settings.workers > 1:
        logger.warning(
            "rate limits are kept in each of the %d worker processes (a key may get up to %d times "
            "its limit); give --state-url to share them",
            settings.workers,
            settings.workers,
        )
    if limiter is not None:
        app.add_middleware(
            RateLimitMiddleware,
            paths=generation_paths(app.routes),
            limiter=limiter,
            limits=key_limits,
            keyed=bool(keys),
            header_format=rate_limit_headers,
        )
    if keys:
        app.add_middleware(
            ApiKeyMiddleware, keys=keys, protect_metrics=settings.protect_metrics, error_shape=error_shape
        )
    app.add_middleware(BodySizeMiddleware, max_bytes=settings.max_body_bytes, error_shape=error_shape)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
        )
    if settings.keep_alive_requests:
        app.add_middleware(ConnectionRequestLimit, max_requests=settings.keep_alive_requests)
    paths = frozenset(getattr(r, "path", "") for r in app.routes)
    app.add_middleware(
        ObservabilityMiddleware,
        metrics=metrics,
        paths=paths,
        access_log=settings.access_log,
        tracing=settings.tracing and tracing.enabled(),
    )
    return app


def _freeze_startup_heap() -> None:
    """Move everything start-up built (imports, tokenizers, the app) out of the garbage collector's
    sight. It lives as long as the process, yet every full collection would scan it again, and a
    stream allocates enough per token to trigger one every few seconds: with transformers' imports
    (torch too, where it is installed) that scan was about a quarter of the gateway's CPU.
    No collection first: the little start-up garbage it would free is not worth a full pass over
    that heap (~0.2 s) per app start, which tests, building hundreds of apps, pay each time."""
    gc.freeze()
