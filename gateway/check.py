"""`gateway check`: what each served model supports, learned from Triton the way the gateway
learns it at start-up (the same summary is logged when a model becomes available)."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from gateway.config import ServedModel, Settings
from gateway.engine import EngineInfo
from gateway.errors import GatewayError
from gateway.text.tokenizer import Tokenizer
from gateway.triton.engine import adapter_for
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
    tokenizer: str = "-"
    context: str = "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def report(
    model: ServedModel, info: EngineInfo | None, error: str | None, tokenizer: Tokenizer | None = None
) -> ModelReport:
    """One model's row, from its capabilities (`Contract.capabilities`) and its tokenizer."""
    triton_model = model.engine_model if model.route == "engine" else model.triton_model
    try:
        if tokenizer is None:
            tokenizer = Tokenizer(model.tokenizer, chat_template_file=model.chat_template)
        vocab = f"{tokenizer.vocab_size} tokens" + (", chat template" if tokenizer.has_chat_template else "")
        context = model.max_model_len or tokenizer.info.max_model_len
    except GatewayError as exc:
        vocab, context = f"error: {exc.message}", None
    if info is None or error is not None:
        return ModelReport(model.name, triton_model, model.route, f"unavailable: {error}", tokenizer=vocab)
    k = info
    return ModelReport(
        name=model.name,
        triton_model=triton_model,
        route=model.route,
        status="ready",
        variant=k.variant,
        decoupled=_yes(k.decoupled),
        token_ids=_yes(k.exposes_token_ids),
        n="num_return_sequences" if k.native_num_sequences else "fan-out",
        guided=_yes(k.guided_decoding),
        logprobs="top-k" if k.top_logprobs else _yes(k.logprobs),
        tokenizer=vocab,
        context=str(context) if context else "unknown",
    )


def table(reports: list[ModelReport]) -> str:
    t = Table(title="served models")
    columns = (
        "model",
        "triton model",
        "route",
        "status",
        "contract",
        "decoupled",
        "token ids",
        "n",
        "guided",
        "logprobs",
        "tokenizer",
        "context",
    )
    for column in columns:
        t.add_column(column)
    for r in reports:
        t.add_row(
            r.name,
            r.triton_model,
            r.route,
            r.status,
            r.variant,
            r.decoupled,
            r.token_ids,
            r.n,
            r.guided,
            r.logprobs,
            r.tokenizer,
            r.context,
        )
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False).print(t)
    return out.getvalue()


async def check(settings: Settings) -> list[ModelReport]:
    pool = TritonPool(settings.triton_url, timeout_s=settings.triton_connect_timeout_s)
    reports = []
    try:
        for model in settings.models:
            engine = adapter_for(pool, model)
            try:
                await engine.introspect()
            except (GatewayError, ValueError) as exc:
                reports.append(report(model, None, getattr(exc, "message", str(exc))))
                continue
            reports.append(report(model, engine.info, None))
    finally:
        await pool.close()
    return reports


def run_check(settings: Settings) -> int:
    if not settings.models:
        raise SystemExit("gateway check: no model configured (use --model name=...,tokenizer=DIR)")
    reports = asyncio.run(check(settings))
    print(table(reports), end="")  # the command's output
    return 0 if all(r.status == "ready" for r in reports) else 1
