"""Runs the gateway under uvicorn (one process, or workers that each build the app from the
settings passed in the environment), after checking what can be checked before the port is bound.
Used by `gateway serve` and `gateway dev`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway import tracing
from gateway.config import Settings
from gateway.logs import configure_logging
from gateway.metrics import multiprocess_dir

if TYPE_CHECKING:
    from gateway.text.tokenizer import Tokenizer

SETTINGS_ENV = "GATEWAY_SETTINGS_JSON"


class StartupError(Exception):
    """A problem found before serving: reported as one line, the process exits with `code`."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def check_before_loading(settings: Settings) -> None:
    """What takes well under a second to check, before anything takes seconds (importing
    transformers, loading tokenizers): a model is configured, its files are there, the port is free."""
    from gateway.errors import ServerConfigError
    from gateway.text.tokenizer import check_tokenizer_files

    if not settings.models:
        raise StartupError("no model configured (use --model name=NAME,tokenizer=DIR)")
    for model in settings.models:
        try:
            check_tokenizer_files(model.tokenizer, model.chat_template)
        except ServerConfigError as exc:
            raise StartupError(f"model {model.name!r}: {exc.message}") from None
    check_port_free(settings.host, settings.port)


def load_tokenizers(settings: Settings) -> dict[str, Tokenizer]:
    """Every model's tokenizer (and chat template), before the port is bound."""
    from gateway.core.models import load_reply_encoding
    from gateway.errors import ServerConfigError
    from gateway.text.tokenizer import Tokenizer

    if not settings.models:
        raise StartupError("no model configured (use --model name=NAME,tokenizer=DIR)")
    loaded = {}
    for model in settings.models:
        try:
            loaded[model.name] = Tokenizer(model.tokenizer, chat_template_file=model.chat_template)
            # The reply format's own encoding (gpt-oss's harmony) is refused here, before the port.
            load_reply_encoding(model, settings.state_dir)
        except ServerConfigError as exc:
            raise StartupError(f"model {model.name!r}: {exc.message}") from None
    return loaded


# How long start-up waits for Triton to show a model's config: a Triton not up yet is no error
# (the gateway waits for it), so this must not hold the start for long.
PROBE_TIMEOUT_S = 3.0


def check_contracts(settings: Settings) -> None:
    """Refuse, with one line, a model whose Triton model speaks no contract the gateway knows,
    when Triton already serves it (read the way the gateway reads it after start-up)."""
    import asyncio

    from gateway.core.pooling import model_task
    from gateway.triton.models import probe_contracts
    from gateway.triton.pool import TritonPool

    async def probe() -> list[str]:
        pool = TritonPool(
            settings.triton_url, timeout_s=min(PROBE_TIMEOUT_S, settings.triton_connect_timeout_s)
        )
        try:
            # Encoder models are read by their own adapter, once the app starts.
            generators = [m for m in settings.models if model_task(m) == "generate"]
            return await probe_contracts(pool, generators)
        finally:
            await pool.close()

    problems = asyncio.run(probe())
    if problems:
        raise StartupError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def check_port_free(host: str, port: int) -> None:
    """Bind and release the address uvicorn will listen on (as uvicorn does, with SO_REUSEADDR),
    so a taken port is one line before anything starts rather than an error after start-up."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"--host {host}: cannot resolve it ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise StartupError(
                f"cannot listen on {host}:{port}: {exc.strerror} (--port, --host)", 1
            ) from None


def _when_ready(host: str, port: int, callback: Callable[[], None]) -> threading.Event:
    """Call `callback` once the server answers its readiness probe (it accepts connections and
    every model is ready: uvicorn binds after its start-up, and the models come later still);
    set the returned event to give up."""
    stop = threading.Event()
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{f'[{target}]' if ':' in target else target}:{port}/health/ready"

    # Straight to this server: never through a proxy the environment names.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def wait() -> None:
        while not stop.is_set():
            # 503 (HTTPError) until every model is ready; refused (URLError) until uvicorn binds.
            with contextlib.suppress(OSError), opener.open(url, timeout=2.0) as answer:
                if answer.status == 200:
                    callback()
                    return
            stop.wait(0.1)

    threading.Thread(target=wait, name="gateway-ready", daemon=True).start()
    return stop


def run_server(
    settings: Settings,
    *,
    tokenizers: dict[str, Tokenizer] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    if tokenizers is None:
        check_before_loading(settings)
    import uvicorn

    from gateway.app import create_app

    if tokenizers is None:
        tokenizers = load_tokenizers(settings)
    check_contracts(settings)
    # Again: the port may have been taken while the tokenizers loaded.
    check_port_free(settings.host, settings.port)
    configure_logging(settings.log_level, settings.log_format)
    if settings.tracing:
        tracing.configure("trtllm-openai-gateway")
    common: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        # Our own access line carries the request id, tokens and TTFT; uvicorn's would repeat it.
        "access_log": False,
        "log_config": None,
        "timeout_graceful_shutdown": settings.shutdown_grace_s + 5,
        # uvicorn's 5 s default races clients that reuse a pooled connection just as it closes.
        "timeout_keep_alive": settings.keep_alive_s,
    }
    stop = _when_ready(settings.host, settings.port, on_ready) if on_ready else None
    try:
        if settings.workers > 1:
            # Worker processes each build the app from the same settings, sharing the port; their
            # metrics meet in a shared directory that /metrics aggregates.
            os.environ[SETTINGS_ENV] = settings.model_dump_json()
            if not multiprocess_dir():
                os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
            if settings.worker_sockets == "shared":
                uvicorn.run("gateway.server:app_from_env", factory=True, workers=settings.workers, **common)
            else:
                _run_workers(settings, common)
        else:
            uvicorn.run(create_app(settings, tokenizers=tokenizers), **common)
    finally:
        if stop is not None:
            stop.set()


def _run_workers(settings: Settings, common: dict[str, Any]) -> None:
    """Each worker on its own SO_REUSEPORT socket (gateway.workers): the kernel spreads connections
    evenly, where one shared accepting socket let whichever worker woke first take a burst."""
    import uvicorn
    from prometheus_client import multiprocess

    from gateway.workers import WorkerPool, reuseport_sockets

    config = uvicorn.Config(
        "gateway.server:app_from_env",
        factory=True,
        workers=settings.workers,
        # A worker builds the app (tokenizers, templates) before it answers the supervisor's pings:
        # on a loaded host that takes longer than uvicorn's 5 s, and it was killed as hung.
        timeout_worker_healthcheck=30,
        **common,
    )
    try:
        sockets = reuseport_sockets(settings.host, settings.port, settings.workers, config.backlog)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror} (--port, --host)", 1
        ) from None
    # A dead worker's live gauges (requests in flight) must leave the aggregated /metrics with it.
    pool = WorkerPool(config, sockets, on_worker_exit=multiprocess.mark_process_dead)
    pool.run()
    if pool.exit_code:
        raise SystemExit(pool.exit_code)


def app_from_env() -> Any:
    from gateway.text.tokenizer import keep_torch_out

    # A worker process: it imports transformers afresh.
    keep_torch_out()
    from gateway.app import create_app

    settings = Settings.model_validate(json.loads(os.environ[SETTINGS_ENV]))
    configure_logging(settings.log_level, settings.log_format)
    if settings.tracing:
        tracing.configure("trtllm-openai-gateway")
    return create_app(settings)
