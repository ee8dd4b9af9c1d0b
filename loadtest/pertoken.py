"""The gateway's own CPU per streamed token, without Triton or sockets: a scripted engine feeds
each API's route of the real app (middleware, router, core, stream writer, SSE response) many
streams at once, and the process CPU per streamed token is reported, with a cProfile of the run
on request. What it leaves out (the Triton reader, uvicorn's HTTP writing) is measured by
`make bench`; this is the part of it that the shared generation core and the APIs own.

    python -m loadtest.pertoken [--apis completions,chat,responses,messages] [--profile chat]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.app import create_app
from gateway.config import ServedModel, Settings
from gateway.engine import EngineInfo, GenerationDelta, GenerationRequest
from gateway.text.tokenizer import Tokenizer

PATHS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
# Prose of ordinary words: what the synthetic engine's streams look like token by token.
REPLY = "The quick brown fox jumps over the lazy dog while the gateway streams every token. " * 8


class ScriptedEngine:
    """Each request's reply, one token a delta, with a turn of the event loop between deltas (as a
    reader of Triton's stream gives them). `token_ids` False: text bytes, as the ensemble route."""

    def __init__(self, tokenizer: Tokenizer, *, token_ids: bool) -> None:
        self._token_ids = token_ids
        ids = tokenizer.encode(REPLY, add_special_tokens=False)
        self._ids = ids
        self._pieces = [tokenizer.decode([i]).encode() for i in ids]

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(
            model="scripted",
            exposes_token_ids=self._token_ids,
            native_num_sequences=True,
            reports_token_counts=True,
            variant="current",
            decoupled=True,
            needs_prompt_ids=False,
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        n = request.params.max_tokens
        for step in range(n):
            await asyncio.sleep(0)
            if self._token_ids:
                yield GenerationDelta(0, token_ids=(self._ids[step % len(self._ids)],), num_tokens=1)
            else:
                yield GenerationDelta(0, text=self._pieces[step % len(self._pieces)], num_tokens=1)

    async def is_ready(self) -> bool:
        return True

    async def ensure_ready(self) -> None:
        return None

    async def close(self) -> None:
        return None


def body(api: str, max_tokens: int) -> bytes:
    prompt = "Tell me a story about a fox. " * 4
    if api == "completions":
        out: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens}
    elif api == "chat":
        out = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        out["stream_options"] = {"include_usage": True}
    elif api == "responses":
        out = {"input": prompt, "max_output_tokens": max_tokens}
    else:
        out = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if api == "completions":
        out["stream_options"] = {"include_usage": True}
    return orjson.dumps({"model": "tiny", "stream": True, "ignore_eos": True, **out})


async def one_request(app: Any, api: str, content: bytes) -> int:
    """Streams one request through the ASGI app; returns the bytes of its body."""
    sent = False
    gone = asyncio.Event()
    received = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": content, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal received, status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            received += len(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATHS[api],
        "raw_path": PATHS[api].encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
            (b"anthropic-version", b"2023-06-01"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    await app(scope, receive, send)
    gone.set()
    if status != 200:
        raise RuntimeError(f"{api}: status {status}")
    return received


async def run_api(app: Any, api: str, *, concurrency: int, requests: int, max_tokens: int) -> float:
    """CPU seconds per streamed token of `requests` streams, `concurrency` at a time."""
    content = body(api, max_tokens)
    await one_request(app, api, content)  # warm-up: first-use imports and caches
    queue = list(range(requests))

    async def worker() -> None:
        while queue:
            queue.pop()
            await one_request(app, api, content)

    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - start) / (requests * max_tokens)


async def main_async(args: argparse.Namespace) -> None:
    from deploy.tiny_model import build_tiny_model

    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else build_tiny_model("bpe")
    settings = Settings(
        models=[ServedModel(name="tiny", tokenizer=tokenizer_dir)],
        max_concurrent_requests=max(args.concurrency, 1) * 2,
    )
    app = create_app(
        settings,
        engine_factory=lambda model: ScriptedEngine(Tokenizer(model.tokenizer), token_ids=args.token_ids),
    )
    async with app.router.lifespan_context(app):
        for api in args.apis:
            profiler = cProfile.Profile() if api in args.profile else None
            results = []
            for _ in range(args.rounds):
                if profiler is not None:
                    profiler.enable()
                results.append(
                    await run_api(
                        app,
                        api,
                        concurrency=args.concurrency,
                        requests=args.requests,
                        max_tokens=args.max_tokens,
                    )
                )
                if profiler is not None:
                    profiler.disable()
            rounds = ", ".join(f"{r * 1e6:.1f}" for r in results)
            print(f"{api:12s} {min(results) * 1e6:6.1f} us/token (min of rounds: {rounds})", flush=True)
            if profiler is not None:
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.top)
                print(out.getvalue())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.pertoken", description=__doc__)
    p.add_argument("--apis", default="completions,chat,responses,messages")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--token-ids", action="store_true", help="the engine route (ids, not text bytes)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the tiny BPE one, built if needed)")
    p.add_argument("--profile", default="", help="comma list of APIs to run under cProfile")
    p.add_argument("--sort", default="tottime", help="cProfile sort key")
    p.add_argument("--top", type=int, default=30)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.apis = [a for a in args.apis.split(",") if a]
    args.profile = {a for a in args.profile.split(",") if a}
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
