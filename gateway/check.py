"""`gateway check`: what each served model supports, learned from Triton the way the gateway
learns it at start-up (the same summary is logged when a model becomes available)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import shutil
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from gateway.config import ServedModel, Settings
from gateway.core.prompt import specials_mismatch
from gateway.engine import EngineInfo
from gateway.errors import GatewayError
from gateway.text.images import takes_images
from gateway.text.parser_detect import suggest_parsers
from gateway.text.reply import reasoning_format_of
from gateway.text.tokenizer import Tokenizer
from gateway.triton.contract import GUIDE_TYPE
from gateway.triton.models import adapter_for
from gateway.triton.pool import TritonPool


@dataclass(frozen=True, slots=True)
class ModelReport:
    name: str
    triton_model: str
    route: str
    status: str
    variant: str = "-"
    decoupled: str = "-"
    token_ids: str = "-"
    n: str = "-"
    guided: str = "-"
    logprobs: str = "-"
    # Whether requests may carry images (the contract's image input, on a vision checkpoint).
    images: str = "-"
    tokenizer: str = "-"
    context: str = "-"
    # Why this route (auto: found from the ensemble's steps, or configured).
    reason: str = "-"
    # Whether a streamed request's text is the exact text (non-streamed text always is).
    streamed_text: str = "-"
    usage: str = "-"
    # Advice under the table: the parsers that fit the model's template and special tokens, and
    # settings that keep its chat prompts or tool calls from working as the model expects.
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _guided(k: EngineInfo) -> str:
    if k.guided_decoding:
        return f"yes ({k.guided_backend})"
    if GUIDE_TYPE in k.inputs:
        return "no (guided_decoding_backend not set up)"
    return "no"


def _images(k: EngineInfo, tokenizer_dir: object) -> str:
    if k.images:
        return "yes"
    if takes_images(str(tokenizer_dir)):
        return "no (the checkpoint has a vision tower; the Triton model has no image input)"
    return "no"


def report(
    model: ServedModel, info: EngineInfo | None, error: str | None, tokenizer: Tokenizer | None = None
) -> ModelReport:
    """One model's row, from its capabilities (`Contract.capabilities`) and its tokenizer."""
    try:
        if tokenizer is None:
            tokenizer = Tokenizer(model.tokenizer, chat_template_file=model.chat_template)
        vocab = f"{tokenizer.vocab_size} tokens" + (", chat template" if tokenizer.has_chat_template else "")
        context = model.max_model_len or tokenizer.info.max_model_len
    except GatewayError as exc:
        vocab, context = f"error: {exc.message}", None
        # `gateway serve` refuses to start with this model: so does check's verdict.
        error = error or "tokenizer error; serve refuses this model"
    if info is None:
        status = f"unavailable: {error}"
        return ModelReport(model.name, model.triton_model, model.route, status, tokenizer=vocab)
    k = info
    fmt = reasoning_format_of(model.reasoning_parser, model.tool_parser)
    if error is None and fmt is not None and fmt.keeps_special_tokens and not k.exposes_token_ids:
        # The gateway answers its requests with this error (core.generation.reasoning_format).
        error = (
            f"reasoning_parser {fmt.name} needs token ids (its markers are special tokens) and the "
            f"{k.route} route returns text: use route=engine or an ensemble with output_ids"
        )
    notes, warnings = _advice(model, k, tokenizer) if tokenizer is not None else ((), ())
    return ModelReport(
        name=model.name,
        triton_model=k.model,
        route=k.route,
        status="ready" if error is None else f"not servable: {error}",
        variant=k.variant,
        decoupled=_yes(k.decoupled),
        token_ids=_yes(k.exposes_token_ids),
        n="num_return_sequences" if k.native_num_sequences else "fan-out",
        guided=_guided(k),
        logprobs="top-k" if k.top_logprobs else _yes(k.logprobs),
        images=_images(k, model.tokenizer),
        tokenizer=vocab,
        context=str(context) if context else "unknown",
        reason=k.route_reason,
        streamed_text="exact"
        if k.exact_stream
        else "LOSSY (postprocessing decodes each response alone; use the engine route)",
        usage=k.usage_source,
        notes=notes,
        warnings=warnings,
    )


def _advice(
    model: ServedModel, info: EngineInfo, tokenizer: Tokenizer
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(notes, warnings) about the parsers and the chat prompt this model gets."""
    notes: list[str] = []
    warnings: list[str] = []
    tool, reasoning = suggest_parsers(tokenizer)
    for setting, configured, fits in (
        ("tool_parser", model.tool_parser, tool),
        ("reasoning_parser", model.reasoning_parser, reasoning),
    ):
        if fits is None or configured == fits:
            continue
        if configured == "none":
            notes.append(f"its chat template and special tokens fit {setting}={fits} (not set)")
        else:
            warnings.append(f"{setting}={configured} is set; its chat template and special tokens fit {fits}")
    if tokenizer.renders_tools and model.tool_parser == "none":
        warnings.append(
            "its chat template renders tools but no tool_parser is set: the model's tool calls come "
            "back as text, and as tool calls only where guided decoding forces one"
            + (f" (set tool_parser={tool})" if tool else "")
        )
    mismatch = specials_mismatch(info.route, model.add_special_tokens, tokenizer)
    if mismatch is not None:
        warnings.append(mismatch)
    return tuple(notes), tuple(warnings)


_COLUMNS = (
    ("model", "name"),
    ("triton model", "triton_model"),
    ("route", "route"),
    ("status", "status"),
    ("contract", "variant"),
    ("decoupled", "decoupled"),
    ("token ids", "token_ids"),
    ("n", "n"),
    ("guided", "guided"),
    ("logprobs", "logprobs"),
    ("images", "images"),
    ("tokenizer", "tokenizer"),
    ("context", "context"),
    ("streamed text", "streamed_text"),
    ("usage from", "usage"),
)


# Wider than any row: the width a table is drawn at when no terminal limits it.
_UNLIMITED = 1000


def terminal_width() -> int | None:
    """The terminal's width in columns (COLUMNS, else the terminal on stdout); None when the
    output goes to no terminal (a pipe, a file, a log collector), where lines may be long."""
    return shutil.get_terminal_size((0, 0)).columns or None


def table(reports: list[ModelReport], width: int | None = None) -> str:
    """The reports as one table, a row per model; where that is wider than `width`, one narrow
    table per model (a row per capability), which fits in 80 columns."""
    wide = _render(_wide_table(reports), _UNLIMITED)
    if width is None or max(map(len, wide.splitlines()), default=0) <= width:
        out = wide
    else:
        out = "".join(_render(_model_table(r), width) for r in reports)
    # The route's reason is a sentence: one line per model under the table reads better than a
    # column (the terminal wraps it); so are the parser notes and warnings.
    lines = []
    for r in reports:
        if r.status == "ready":
            lines.append(f"{r.name}: {r.route} route: {r.reason}")
        lines.extend(f"{r.name}: {note}" for note in r.notes)
        lines.extend(f"{r.name}: warning: {warning}" for warning in r.warnings)
    return out + "".join(line + "\n" for line in lines)


def _wide_table(reports: list[ModelReport]) -> Table:
    t = Table(title="served models")
    for column, _ in _COLUMNS:
        t.add_column(column)
    for r in reports:
        t.add_row(*(getattr(r, attr) for _, attr in _COLUMNS))
    return t


def _model_table(r: ModelReport) -> Table:
    t = Table(title=f"served model {r.name}", show_header=False)
    t.add_column("capability", no_wrap=True)
    t.add_column("value", overflow="fold")
    for column, attr in _COLUMNS[1:]:
        t.add_row(column, getattr(r, attr))
    return t


def _render(t: Table, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False).print(t)
    # Rich pads each line to the table's width; the padding is nothing to read.
    return "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())


async def check(settings: Settings) -> list[ModelReport]:
    pool = TritonPool(
        settings.triton_url, timeout_s=settings.triton_connect_timeout_s, http_urls=settings.triton_http_url
    )
    reports = []
    try:
        for model in settings.models:
            engine = adapter_for(pool, model)
            try:
                await engine.introspect()
            except (GatewayError, ValueError) as exc:
                reports.append(report(model, None, getattr(exc, "message", str(exc))))
                continue
            tokenizer = None
            with contextlib.suppress(GatewayError):
                tokenizer = Tokenizer(model.tokenizer, chat_template_file=model.chat_template)
            reports.append(report(model, engine.info, None, tokenizer))
    finally:
        await pool.close()
    return reports


def run_check(settings: Settings) -> int:
    if not settings.models:
        raise SystemExit("gateway check: no model configured (use --model name=...,tokenizer=DIR)")
    urls = ", ".join(settings.triton_url)
    default = "" if "triton_url" in settings.model_fields_set else " (the default; set --triton-url)"
    print(f"Triton: {urls}{default}")  # the command's output
    reports = asyncio.run(check(settings))
    print(table(reports, terminal_width()), end="")
    return 0 if all(r.status == "ready" for r in reports) else 1
