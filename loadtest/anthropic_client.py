"""Anthropic Messages API target: POST /v1/messages over aiohttp (or loadtest.lean_http's client),
streaming or not."""

from __future__ import annotations

import time
from typing import Any

from loadtest.fastjson import dumps as _dumps
from loadtest.metrics import RequestRecord
from loadtest.sse import SSEParser, loads
from loadtest.target import detail, error_kind, http_session, server_message
from loadtest.workload import Prompt, Workload


def whole_prompt(usage: dict[str, Any], default: int | None) -> int | None:
    """The prompt's tokens from Anthropic's usage, which counts cache reads and writes apart from
    `input_tokens`."""
    if "input_tokens" not in usage:
        return default
    return int(usage["input_tokens"]) + sum(
        int(usage.get(k) or 0) for k in ("cache_read_input_tokens", "cache_creation_input_tokens")
    )


class AnthropicTarget:
    """Sends the workload to a server speaking Anthropic's Messages API (the gateway's /v1/messages)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        workload: Workload,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        name: str = "messages",
        fresh_connections: bool = False,
        client: str = "aiohttp",
    ) -> None:
        # A new connection per request (loadtest.target.http_session), for a benchmark of many clients.
        self._fresh_connections = fresh_connections
        # The HTTP client: aiohttp, or loadtest.lean_http's (bench-host's many-worker load).
        self._client = client
        self.name = name
        self._model = model
        self._workload = workload
        self._timeout = timeout
        self._headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        if api_key:
            self._headers["x-api-key"] = api_key
        self._url = base_url.rstrip("/") + "/v1/messages"
        self._session: Any = None  # an aiohttp.ClientSession or a lean_http.LeanSession

    async def open(self, max_concurrency: int) -> None:
        self._session = http_session(
            max_concurrency, self._timeout, fresh_connections=self._fresh_connections, client=self._client
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def body(self, prompt: Prompt) -> dict[str, Any]:
        w = self._workload
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": w.max_tokens_for(prompt),
            "messages": prompt.chat_messages(),
        }
        if w.stream:
            body["stream"] = True
        if w.temperature is not None:
            body["temperature"] = w.temperature
        if w.ignore_eos:
            body["ignore_eos"] = True
        body.update(w.extra_body)
        return body

    async def send(self, prompt: Prompt) -> RequestRecord:
        session = self._session
        if session is None:
            raise RuntimeError("AnthropicTarget.send before open()")
        content = _dumps(self.body(prompt))
        stream = self._workload.stream
        times: list[float] = []
        output_tokens: int | None = None
        prompt_tokens: int | None = prompt.prompt_tokens
        error: str | None = None
        error_msg: str | None = None
        start = time.perf_counter()
        try:
            async with session.post(self._url, data=content, headers=self._headers) as resp:
                if resp.status != 200:
                    body = await resp.read()
                    error, error_msg = f"http_{resp.status}", detail(server_message(body))
                elif stream:
                    parser = SSEParser()
                    done = False
                    perf = time.perf_counter
                    async for raw in resp.content.iter_any():
                        now = perf()
                        for event in parser.feed(raw):
                            kind = event.event
                            if kind == "content_block_delta":
                                times.append(now)
                            elif kind == "message_start":
                                usage = loads(event.data)["message"]["usage"]
                                prompt_tokens = whole_prompt(usage, prompt_tokens)
                            elif kind == "message_delta":
                                output_tokens = loads(event.data)["usage"]["output_tokens"]
                            elif kind == "message_stop":
                                done = True
                            elif kind == "error":
                                error, error_msg = "stream_error", detail(loads(event.data)["error"])
                    if not done and error is None:
                        error, error_msg = "incomplete_stream", "the stream ended without message_stop"
                else:
                    obj = loads(await resp.read())
                    times.append(time.perf_counter())
                    usage = obj.get("usage") or {}
                    output_tokens = usage.get("output_tokens")
                    prompt_tokens = whole_prompt(usage, prompt_tokens)
        except Exception as exc:  # every failure is a counted error, never an aborted run
            error, error_msg = error_kind(exc), detail(repr(exc))
        end = time.perf_counter()
        return RequestRecord(
            start=start,
            end=end,
            chunk_times=tuple(times),
            output_tokens=output_tokens if output_tokens is not None else len(times),
            prompt_tokens=prompt_tokens,
            usage_reported=output_tokens is not None,
            streamed=stream,
            error=error,
            error_detail=error_msg,
        )
