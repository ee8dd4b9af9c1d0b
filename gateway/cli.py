"""`gateway serve | dev | check`: parses flags into Settings and hands them on; nothing else.

Flags are generated from the Settings fields, so every option documents its environment variable.
Everything that can be checked before the port is bound is checked first, and a problem is one
line on stderr naming the flag, file or value, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway.config import ConfigFileError, ServedModel, Settings, describe, env_name, flag_name
from gateway.invocation import gateway_command
from gateway.server import StartupError, run_server
from gateway.text.reasoning.registry import MODEL_FORMATS as REASONING_FORMATS
from gateway.text.tool_calls.registry import MODEL_FORMATS

# What each repeatable flag takes.
_METAVARS = {
    "triton_url": "HOST:PORT",
    "triton_http_url": "URL",
    "triton_metrics_url": "URL",
    "objective_priorities": "NAME=PRIORITY[,NAME=PRIORITY]",
    "lora_modules": "NAME=PATH[,base=MODEL][,server_path=PATH]",
    "lora_dynamic_roots": "DIR",
    "admin_api_keys": "KEY",
    "api_keys": "KEY",
    "cors_origins": "ORIGIN",
    "allowed_media_domains": "HOST",
    "config_file": "FILE",
    "api_key_file": "FILE",
    "host": "ADDRESS",
    "key_rate_limits": "key=KEY[,rpm=N][,tpm=N]",
    "state_url": "redis://HOST:PORT/DB",
}
# `gateway check` reads only these; the serving flags would be ignored there.
CHECK_SETTINGS = ("triton_url", "triton_http_url", "models", "config_file", "triton_connect_timeout_s")
# What `gateway dev` sets itself.
DEV_SKIPS = ("models", "triton_url", "triton_http_url", "triton_metrics_url")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not the whole usage block above it.
        # The hint is a command to run: written as this installation's `gateway` runs.
        command = self.prog.replace("gateway", gateway_command(), 1)
        self.exit(2, f"{self.prog}: error: {message} (see `{command} --help`)\n")


def _add_settings_flags(
    parser: argparse.ArgumentParser, skip: Sequence[str] = (), only: Sequence[str] | None = None
) -> None:
    for name, field in Settings.model_fields.items():
        if name in skip or (only is not None and name not in only):
            continue
        flag = flag_name(name)
        help_text = f"{field.description} [env: {env_name(name)}]"
        default = field.get_default(call_default_factory=True)
        if name == "models":
            parser.add_argument(
                flag,
                dest=name,
                action="append",
                type=_model_spec,
                metavar=ServedModel.spec_syntax(),
                help=f"{help_text}; repeatable",
            )
        elif get_origin(field.annotation) is list:
            shown = f" (default: {','.join(default)})" if default else ""
            parser.add_argument(
                flag,
                dest=name,
                action="append",
                metavar=_METAVARS.get(name, "VALUE"),
                help=f"{help_text}; repeatable{shown}",
            )
        elif field.annotation is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} (default: {default})",
            )
        elif get_origin(field.annotation) is Literal:
            parser.add_argument(
                flag,
                dest=name,
                choices=get_args(field.annotation),
                type=str.lower,
                default=None,
                help=f"{help_text} (default: {default})",
            )
        else:
            kind = next((a for a in get_args(field.annotation) if a is not type(None)), field.annotation)
            parser.add_argument(
                flag,
                dest=name,
                type=kind if kind in (int, float) else str,  # type: ignore[arg-type]
                default=None,
                metavar=_METAVARS.get(name),
                help=f"{help_text} (default: {default})",
            )


def _model_spec(value: str) -> ServedModel:
    try:
        return ServedModel.parse_spec(value)
    except ValidationError as exc:
        keys = ", ".join(ServedModel.model_fields)
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'spec'}: "
            f"{f'unknown key (keys: {keys})' if e['type'] == 'extra_forbidden' else e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise argparse.ArgumentTypeError(f"{value!r}: {problems}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gateway", description="OpenAI-compatible gateway for Triton + TensorRT-LLM")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve models from a running Triton")
    _add_settings_flags(serve)
    check = sub.add_parser("check", help="report what each served model supports, as read from Triton")
    _add_settings_flags(check, only=CHECK_SETTINGS)
    dev = sub.add_parser(
        "dev", help="start the embedded CPU stack (tritonserver + tiny model) and the gateway"
    )
    _add_settings_flags(dev, skip=DEV_SKIPS)
    dev.add_argument(
        "--model-dir", default=None, help="local Hugging Face model dir (default: build a tiny model)"
    )
    dev.add_argument("--served-name", default="tiny", help="model name clients use (default: tiny)")
    dev.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        # As vLLM's flag: a family's tool template (its own may render no tools).
        help="Jinja chat template file overriding the model's, as the `chat_template` of a --model",
    )
    dev.add_argument(
        "--tool-parser",
        choices=MODEL_FORMATS,
        # The dev model's chat template renders tools the Hermes way (agents send tools every turn).
        default="hermes",
        help="how the model writes tool calls, as the `tool_parser` of a --model (default: hermes)",
    )
    dev.add_argument(
        "--reasoning-parser",
        choices=REASONING_FORMATS,
        # The dev model has `<think>` tokens and a Qwen3-style template (enable_thinking).
        default="qwen3",
        help="how the model writes its thinking, as the `reasoning_parser` of a --model (default: qwen3)",
    )
    dev.add_argument("--variant", choices=("current", "legacy"), default="current", help="contract variant")
    dev.add_argument(
        "--engine",
        choices=("cpp", "llmapi"),
        default="cpp",
        help="cpp: the C++ TensorRT-LLM repository (ensemble + tensorrt_llm) on the CPU reference engine; "
        "llmapi: a CPU stand-in of TensorRT-LLM's llmapi Python model (default: cpp)",
    )
    dev.add_argument(
        "--llmapi-profile",
        choices=("current", "v1.2"),
        default="current",
        help="with --engine llmapi: the model.py it behaves as (v1.2: one response per stream)",
    )
    dev.add_argument(
        "--encoder-input",
        choices=("ids", "text"),
        default="ids",
        help="with an embedding model's --model-dir (a sentence-transformers layout): ids serves the "
        "Triton model that takes token ids, as an ONNX or TensorRT export does; text the Python model "
        "that takes text (default: ids)",
    )
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


def load_settings(args: argparse.Namespace) -> Settings:
    """Settings from flags, environment and file, or a StartupError naming what is wrong."""
    try:
        return settings_from_args(args)
    except ConfigFileError as exc:
        raise StartupError(describe(exc.error, path=exc.path, file_keys=exc.keys)) from None
    except ValidationError as exc:
        raise StartupError(describe(exc)) from None
    except (SettingsError, ValueError) as exc:
        raise StartupError(str(exc).strip().splitlines()[0]) from None


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    prog = f"gateway {args.command}"
    if args.command in ("serve", "check", "dev"):
        # `gateway dev` builds its tiny model in a child process: this one only serves.
        from gateway.text.tokenizer import keep_torch_out

        keep_torch_out()
    try:
        settings = load_settings(args)
        if args.command == "serve":
            run_server(settings)
        elif args.command == "check":
            from gateway.check import run_check

            raise SystemExit(run_check(settings))
        elif args.command == "dev":
            from gateway.devserver import run_dev

            run_dev(settings, args)
    except StartupError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(exc.code) from None


if __name__ == "__main__":
    main()
