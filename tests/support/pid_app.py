"""A tiny ASGI app that answers with the pid of the worker that served it, and the entry point that
serves it with gateway.workers' pool: `python -m tests.support.pid_app PORT WORKERS`.

`GET /slow?s=SECONDS` sends its head at once and the pid after that long (graceful shutdown lets
it finish)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


async def app(
    scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]
) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = str(os.getpid()).encode()
    if scope["path"] == "/slow":
        # The head goes out at once (the client then knows the request is in a worker), the pid last.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await asyncio.sleep(float(scope["query_string"].decode().partition("=")[2] or 1))
        await send({"type": "http.response.body", "body": body})
        return
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn

    from gateway.workers import WorkerPool, reuseport_sockets

    port, workers = int(sys.argv[1]), int(sys.argv[2])
    config = uvicorn.Config(
        "tests.support.pid_app:app", workers=workers, log_level="warning", timeout_graceful_shutdown=30
    )
    pool = WorkerPool(config, reuseport_sockets("127.0.0.1", port, workers, 128))
    pool.run()
    raise SystemExit(pool.exit_code)


if __name__ == "__main__":
    main()
