"""Reference tables for the documentation, made from the code that is their truth (Settings, the
served-model keys, the CLI, the metrics), so the documentation cannot drift from it.

A page asks for one with a line `<!-- reference: NAME -->`; the site's build hook (docs/hooks.py)
replaces it with `expand`. Nothing here runs while the gateway serves.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gateway.config import FLAG_NAMES, KeyRateLimit, ServedModel, Settings, env_name, flag_name

MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.M)


def _cell(text: str) -> str:
    # A table cell is one line; a `|` would end it.
    return " ".join(text.split()).replace("|", "\\|")


def _default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, Path):
        home = str(Path.home())
        text = str(value)
        return f"`~{text[len(home) :]}`" if text.startswith(home) else f"`{text}`"
    if isinstance(value, list):
        return ", ".join(f"`{v}`" for v in value) if value else "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def settings_table() -> str:
    """Every setting: its flag, environment variable and YAML key, its default and description."""
    rows = ["| flag, environment variable, YAML key | default | what it does |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        names = [f"`{flag_name(name)}`", f"`{env_name(name)}`"]
        if name != "config_file":
            names.append(f"`{name}`" + (" (or `model`)" if name == "models" else ""))
        default = field.get_default(call_default_factory=True)
        rows.append(f"| {'<br>'.join(names)} | {_default(default)} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def _fields_table(model: type[Any], first: str) -> str:
    rows = [f"| {first} | default | what it is |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        default = (
            "required" if field.is_required() else _default(field.get_default(call_default_factory=True))
        )
        rows.append(f"| `{name}` | {default} | {_cell(field.description or '')} |")
    return "\n".join(rows)


def model_keys_table() -> str:
    """The keys of a served model (`--model name=...,tokenizer=...`)."""
    return _fields_table(ServedModel, "key")


def key_rate_limit_table() -> str:
    """The keys of one API key's own rate limits (`--key-rate-limit key=...,rpm=...`)."""
    return _fields_table(KeyRateLimit, "key")


def dev_flags_table() -> str:
    """The flags `gateway dev` has beyond the settings."""
    from gateway.cli import build_parser

    dev = _subparser(build_parser(), "dev")
    settings_flags = {flag_name(name) for name in Settings.model_fields} | set(FLAG_NAMES.values())
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for action in dev._actions:
        flags = [f for f in action.option_strings if f.startswith("--")]
        if not flags or flags[0] in settings_flags or flags[0] == "--help":
            continue
        choices = f" ({', '.join(f'`{c}`' for c in action.choices)})" if action.choices else ""
        rows.append(f"| `{flags[0]}` | {_default(action.default)} | {_cell(action.help or '')}{choices} |")
    return "\n".join(rows)


def check_flags() -> str:
    """The settings `gateway check` reads, as a sentence."""
    from gateway.cli import CHECK_SETTINGS

    return ", ".join(f"`{flag_name(name)}`" for name in CHECK_SETTINGS)


def metrics_table() -> str:
    """Every metric the gateway exports on /metrics, as the exposition names it."""
    from gateway.metrics import GatewayMetrics

    rows = ["| metric | type | labels | what it counts |", "|---|---|---|---|"]
    for metric in metric_families(GatewayMetrics()):
        labels = ", ".join(f"`{label}`" for label in metric["labels"]) or "none"
        rows.append(f"| `{metric['name']}` | {metric['type']} | {labels} | {_cell(metric['help'])} |")
    from gateway.modelserver import FAMILIES

    for name, (label_names, text) in FAMILIES.items():
        labels = ", ".join(f"`{label}`" for label in label_names)
        rows.append(f"| `{name}` | gauge | {labels} | {_cell(text)} |")
    return "\n".join(rows)


def metric_families(metrics: Any) -> list[dict[str, Any]]:
    """Name (as exported: counters end in `_total`), type, labels and help of each metric."""
    families = []
    for value in vars(metrics).values():
        kind = getattr(value, "_type", None)
        name = getattr(value, "_name", None)
        if kind is None or name is None:
            continue
        exported = f"{name}_total" if kind == "counter" else name
        families.append(
            {
                "name": exported,
                "type": kind,
                "labels": list(getattr(value, "_labelnames", ())),
                "help": getattr(value, "_documentation", ""),
            }
        )
    return families


# Fields OpenAI defines that a request refuses by name rather than ignore (the Responses API's
# server-side conversations and prompt templates would change the answer).
REFUSED_FIELDS: dict[str, frozenset[str]] = {"responses": frozenset({"conversation", "prompt"})}


def ignored_fields(api: str) -> list[str]:
    """The fields OpenAI defines for `api`'s request that the gateway accepts and does not use."""
    from gateway.apis.chat_completions.protocol import OPENAI_FIELDS as CHAT
    from gateway.apis.chat_completions.protocol import ChatCompletionRequest
    from gateway.apis.completions.protocol import OPENAI_FIELDS as COMPLETIONS
    from gateway.apis.completions.protocol import CompletionRequest
    from gateway.apis.responses.protocol import OPENAI_FIELDS as RESPONSES
    from gateway.apis.responses.protocol import CreateResponseRequest

    requests: dict[str, tuple[frozenset[str], type[BaseModel]]] = {
        "chat": (CHAT, ChatCompletionRequest),
        "completions": (COMPLETIONS, CompletionRequest),
        "responses": (RESPONSES, CreateResponseRequest),
    }
    defined, request = requests[api]
    return sorted(defined - request.model_fields.keys() - REFUSED_FIELDS.get(api, frozenset()))


def _ignored_list(api: str) -> Callable[[], str]:
    return lambda: (
        ", ".join(f"`{name}`" for name in ignored_fields(api)) + "." if ignored_fields(api) else "none."
    )


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(name)


REFERENCES: dict[str, Callable[[], str]] = {
    "settings": settings_table,
    "model-keys": model_keys_table,
    "key-rate-limit": key_rate_limit_table,
    "dev-flags": dev_flags_table,
    "check-flags": check_flags,
    "metrics": metrics_table,
    "ignored-chat": _ignored_list("chat"),
    "ignored-completions": _ignored_list("completions"),
    "ignored-responses": _ignored_list("responses"),
}


def expand(markdown: str) -> str:
    """The page with each `<!-- reference: NAME -->` line replaced by that table; an unknown name
    is a KeyError, so a misspelt marker fails the build rather than vanish."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in REFERENCES:
            raise KeyError(f"unknown reference {name!r}; known: {', '.join(REFERENCES)}")
        return REFERENCES[name]()

    return MARKER.sub(replace, markdown)
