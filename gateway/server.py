"""Runs the gateway under uvicorn (one process, or workers that each build the app from the
settings passed in the environment). Used by `gateway serve` and `gateway dev`."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from gateway import tracing
from gateway.config import Settings
from gateway.logs import configure_logging
from gateway.metrics import multiprocess_dir

SETTINGS_ENV = "GATEWAY_SETTINGS_JSON"


def run_server(settings: Settings) -> None:
    import uvicorn

    from gateway.app import create_app

    configure_logging(settings.log_level, settings.log_format)
    if settings.tracing:
        tracing.configure("trtllm-openai-gateway")
    if not settings.models:
        raise SystemExit("gateway: no model configured (use --model name=...,tokenizer=DIR)")
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
    if settings.workers > 1:
        # Worker processes each build the app from the same settings, sharing the port; their
        # metrics meet in a shared directory that /metrics aggregates.
        os.environ[SETTINGS_ENV] = settings.model_dump_json()
        if not multiprocess_dir():
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
        uvicorn.run("gateway.server:app_from_env", factory=True, workers=settings.workers, **common)
    else:
        uvicorn.run(create_app(settings), **common)


def app_from_env() -> Any:
    from gateway.app import create_app

    settings = Settings.model_validate(json.loads(os.environ[SETTINGS_ENV]))
    configure_logging(settings.log_level, settings.log_format)
    if settings.tracing:
        tracing.configure("trtllm-openai-gateway")
    return create_app(settings)
