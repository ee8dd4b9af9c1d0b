from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sse_starlette.sse import AppStatus

from gateway.app import create_app
from gateway.config import ServedModel, Settings
from tests.support.fake_engine import FakeEngine
from tests.support.fixtures import tiny_agent_dir, tiny_bpe_dir, tiny_metaspace_dir  # noqa: F401
from tests.support.redis_server import redis_server, redis_url  # noqa: F401
from tests.support.tokenizers import loaded_tokenizer

MakeClient = Callable[..., Awaitable[tuple[httpx.AsyncClient, FakeEngine]]]


@pytest.fixture
async def make_client(tiny_bpe_dir: Path) -> AsyncIterator[MakeClient]:  # noqa: F811
    """An ASGI client on a fresh app whose model `tiny` runs on a FakeEngine (the bpe tiny
    tokenizer unless `tokenizer_dir` says another)."""
    contexts: list[Any] = []
    clients: list[httpx.AsyncClient] = []

    async def factory(
        settings: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        tokenizer_dir: Path | None = None,
        **engine_kwargs: Any,
    ) -> tuple[httpx.AsyncClient, FakeEngine]:
        AppStatus.should_exit = False
        engines: list[FakeEngine] = []

        def engine_factory(model: ServedModel) -> FakeEngine:
            engine = FakeEngine(loaded_tokenizer(model.tokenizer), **engine_kwargs)
            engines.append(engine)
            return engine

        config = Settings(
            models=[ServedModel(name="tiny", tokenizer=tokenizer_dir or tiny_bpe_dir, **(model or {}))],
            **(settings or {}),
        )
        served = config.models[0]
        app = create_app(
            config,
            engine_factory=engine_factory,
            tokenizers={served.name: loaded_tokenizer(served.tokenizer, served.chat_template)},
        )
        ctx = app.router.lifespan_context(app)
        await ctx.__aenter__()
        contexts.append(ctx)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test")
        clients.append(client)
        return client, engines[0]

    yield factory
    for client in clients:
        await client.aclose()
    for ctx in reversed(contexts):
        await ctx.__aexit__(None, None, None)
