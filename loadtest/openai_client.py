"""OpenAI-API target: /v1/completions, /v1/chat/completions or /v1/responses over aiohttp (or
loadtest.lean_http's client), streaming or not."""

from __future__ import annotations

import time
from typing import Any

from loadtest.fastjson import dumps as _dumps
from loadtest.metrics import RequestRecord
from loadtest.sse import DONE, SSEParser, loads
from loadtest.target import detail, error_kind, http_session, server_message
from loadtest.workload import Prompt, Workload


class OpenAITarget:
    """Sends the workload to an OpenAI-compatible server (the gateway, LiteLLM, vLLM, ...)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        workload: Workload,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        name: str = "openai",
        trust_usage: bool = True,
        fresh_connections: bool = False,
        client: str = "aiohttp",
    ) -> None:
        # A new connection per request (loadtest.target.http_session), for a benchmark of many clients.
        self._fresh_connections = fresh_connections
        # The HTTP client: aiohttp, or loadtest.lean_http's (bench-host's many-worker load).
        self._client = client
        self.name = name
        # Some proxies estimate usage with their own tokenizer (LiteLLM counts the text with tiktoken):
        # then the content chunks, one per engine token, are the truer count.
        self._trust_usage = trust_usage
        self._base_url = base_url.rstrip("/")
        self._model = model
        self._workload = workload
        self._timeout = timeout
        # The session (target.http_session) already asks for uncompressed bodies.
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        paths = {"chat": "/chat/completions", "responses": "/responses", "completions": "/completions"}
        self._url = self._base_url + paths[workload.endpoint]
        self._session: Any = None  # an aiohttp.ClientSession or a lean_http.LeanSession

    @property
    def base_url(self) -> str:
        return self._base_url

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
        if w.endpoint == "responses":
            return self._responses_body(prompt)
        body: dict[str, Any] = {"model": self._model, "max_tokens": w.max_tokens_for(prompt)}
        if w.endpoint == "chat":
            body["messages"] = prompt.chat_messages()
        else:
            body["prompt"] = prompt.text
        if w.stream:
            body["stream"] = True
            if w.include_usage:
                body["stream_options"] = {"include_usage": True}
        if w.temperature is not None:
            body["temperature"] = w.temperature
        if w.ignore_eos:
            body["ignore_eos"] = True
        body.update(w.extra_body)
        return body

    def _responses_body(self, prompt: Prompt) -> dict[str, Any]:
        w = self._workload
        body: dict[str, Any] = {
            "model": self._model,
            "input": prompt.chat_messages(),
            "max_output_tokens": w.max_tokens_for(prompt),
            # What a benchmark asks of the other endpoints: nothing kept afterwards.
            "store": False,
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
        if self._workload.endpoint == "responses":
            return await self._send_responses(prompt)
        session = self._session
        if session is None:
            raise RuntimeError("OpenAITarget.send before open()")
        content = _dumps(self.body(prompt))
        stream = self._workload.stream
        chat = self._workload.endpoint == "chat"
        times: list[float] = []
        usage_tokens: int | None = None
        reported: bool | None = None
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
                            data = event.data
                            if data == DONE:
                                done = True
                                continue
                            obj: Any = loads(data)
                            if "error" in obj:
                                error, error_msg = "stream_error", detail(obj["error"])
                                continue
                            choices = obj.get("choices")
                            if choices:
                                c = choices[0]
                                text = (c.get("delta") or {}).get("content") if chat else c.get("text")
                                if text:
                                    times.append(now)
                            usage = obj.get("usage")
                            if usage:
                                usage_tokens = usage.get("completion_tokens")
                                prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                    if not done and error is None:
                        error, error_msg = "incomplete_stream", "the stream ended without data: [DONE]"
                else:
                    obj = loads(await resp.read())
                    times.append(time.perf_counter())
                    if "error" in obj:
                        error, error_msg = "response_error", detail(obj["error"])
                    usage = obj.get("usage") or {}
                    usage_tokens = usage.get("completion_tokens")
                    prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                    reported = usage_tokens is not None
                    if usage_tokens is None:
                        # No usage and no chunks to count: whitespace words are the only estimate left.
                        c = (obj.get("choices") or [{}])[0]
                        text = (c.get("message") or {}).get("content") if chat else c.get("text")
                        usage_tokens = len((text or "").split())
        except Exception as exc:  # every failure is a counted error, never an aborted run
            error, error_msg = error_kind(exc), detail(repr(exc))
        end = time.perf_counter()
        use_usage = usage_tokens is not None and (self._trust_usage or not stream)
        return RequestRecord(
            start=start,
            end=end,
            chunk_times=tuple(times),
            output_tokens=usage_tokens if use_usage and usage_tokens is not None else len(times),
            prompt_tokens=prompt_tokens,
            usage_reported=use_usage and reported is not False,
            streamed=stream,
            error=error,
            error_detail=error_msg,
        )

    async def _send_responses(self, prompt: Prompt) -> RequestRecord:
        """/v1/responses: text arrives as response.output_text.delta events, usage in the last
        event's response (response.completed, or response.incomplete at the output limit)."""
        session = self._session
        if session is None:
            raise RuntimeError("OpenAITarget.send before open()")
        content = _dumps(self.body(prompt))
        stream = self._workload.stream
        times: list[float] = []
        usage_tokens: int | None = None
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
                            obj: Any = loads(event.data)
                            kind = obj.get("type")
                            if kind == "response.output_text.delta":
                                if obj.get("delta"):
                                    times.append(now)
                            elif kind in ("response.completed", "response.incomplete"):
                                done = True
                                usage = obj["response"].get("usage") or {}
                                usage_tokens = usage.get("output_tokens")
                                prompt_tokens = usage.get("input_tokens", prompt_tokens)
                            elif kind in ("response.failed", "error"):
                                error, error_msg = "stream_error", detail(obj)
                    if not done and error is None:
                        error, error_msg = (
                            "incomplete_stream",
                            "the stream ended without a final response event",
                        )
                else:
                    obj = loads(await resp.read())
                    times.append(time.perf_counter())
                    if obj.get("error"):
                        error, error_msg = "response_error", detail(obj["error"])
                    usage = obj.get("usage") or {}
                    usage_tokens = usage.get("output_tokens")
                    prompt_tokens = usage.get("input_tokens", prompt_tokens)
        except Exception as exc:  # every failure is a counted error, never an aborted run
            error, error_msg = error_kind(exc), detail(repr(exc))
        end = time.perf_counter()
        return RequestRecord(
            start=start,
            end=end,
            chunk_times=tuple(times),
            output_tokens=usage_tokens if usage_tokens is not None else len(times),
            prompt_tokens=prompt_tokens,
            usage_reported=usage_tokens is not None,
            streamed=stream,
            error=error,
            error_detail=error_msg,
        )
