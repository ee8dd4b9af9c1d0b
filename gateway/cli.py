"""`gateway serve | dev`: parses flags into Settings and starts uvicorn; nothing else.

Flags are generated from the Settings fields, so every option documents its environment variable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, get_args, get_origin

from pydantic import ValidationError

from gateway import tracing
from gateway.config import ServedModel, Settings
from gateway.logs import configure_logging
from gateway.metrics import multiprocess_dir

SETTINGS_ENV = "GATEWAY_SETTINGS_JSON"
# Settings whose flag name differs from the field name (repeatable, singular).
_FLAG_NAMES = {"triton_url": "--triton-url", "models": "--model"}


def _add_settings_flags(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> None:
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        flag = _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))
        env = f"GATEWAY_{name.upper()}"
        help_text = f"{field.description} [env: {env}]"
        if name == "models":
            parser.add_argument(
                flag,
                dest=name,
                action="append",
                type=_model_spec,
                metavar="name=N,tokenizer=DIR[,triton_model=M][,route=auto|ensemble|engine]",
                help=f"{help_text}; repeatable",
            )
        elif get_origin(field.annotation) is list:
            parser.add_argument(
                flag, dest=name, action="append", metavar="HOST:PORT", help=f"{help_text}; repeatable"
            )
        elif field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            kind = next((a for a in get_args(field.annotation) if a is not type(None)), field.annotation)
            parser.add_argument(
                flag,
                dest=name,
                type=kind if kind in (int, float) else str,  # type: ignore[arg-type]
                default=None,
                help=f"{help_text} (default: {field.default})",
            )


def _model_spec(value: str) -> ServedModel:
    try:
        return ServedModel.parse_spec(value)
    except (ValueError, ValidationError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="OpenAI-compatible gateway for Triton + TensorRT-LLM"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve models from a running Triton")
    _add_settings_flags(serve)
    check = sub.add_parser("check", help="report what each served model supports, as read from Triton")
    _add_settings_flags(check)
    dev = sub.add_parser(
        "dev", help="start the embedded CPU stack (tritonserver + tiny model) and the gateway"
    )
    _add_settings_flags(dev, skip=("models", "triton_url"))
    dev.add_argument(
        "--model-dir", default=None, help="local Hugging Face model dir (default: build a tiny model)"
    )
    dev.add_argument("--served-name", default="tiny", help="model name clients use (default: tiny)")
    dev.add_argument("--variant", choices=("current", "legacy"), default="current", help="contract variant")
    dev.add_argument(
        "--engine-mode",
        choices=("model", "synthetic"),
        default="model",
        help="CPU engine: real model or synthetic",
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {name: getattr(args, name, None) for name in Settings.model_fields}
    return Settings.load(**overrides)


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
        uvicorn.run("gateway.cli:app_from_env", factory=True, workers=settings.workers, **common)
    else:
        uvicorn.run(create_app(settings), **common)


def app_from_env() -> Any:
    from gateway.app import create_app

    settings = Settings.model_validate(json.loads(os.environ[SETTINGS_ENV]))
    configure_logging(settings.log_level, settings.log_format)
    if settings.tracing:
        tracing.configure("trtllm-openai-gateway")
    return create_app(settings)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except (ValidationError, ValueError) as exc:
        print(f"gateway: invalid settings: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.command == "serve":
        run_server(settings)
    elif args.command == "check":
        from gateway.check import run_check

        raise SystemExit(run_check(settings))
    elif args.command == "dev":
        from gateway.devserver import run_dev

        run_dev(settings, args)


if __name__ == "__main__":
    main()
