"""`gateway serve | dev | check`: parses flags into Settings and hands them on; nothing else.

Flags are generated from the Settings fields, so every option documents its environment variable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, get_args, get_origin

from pydantic import ValidationError

from gateway.config import ServedModel, Settings
from gateway.server import run_server

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
                metavar="name=N,tokenizer=DIR[,triton_model=M][,route=ensemble|engine]",
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
