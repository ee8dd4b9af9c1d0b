"""Triton's native HTTP generate extension: `POST /v2/models/<model>/generate_stream` (SSE).

Each event is a JSON object with the model's outputs (`text_output`, ...); an `{"error": "..."}`
event is a failure; the stream ends when Triton closes it (there is no `[DONE]`).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp

from loadtest.fastjson import dumps as _dumps
from loadtest.metrics import RequestRecord
from loadtest.sse import SSEParser, loads
from loadtest.target import detail, error_kind, http_session
from loadtest.workload import Prompt, Workload


class TritonHttpTarget:
    def __init__(
        self,
        base_url: str,
        model: str,
        workload: Workload,
        *,
        timeout: float = 300.0,
        name: str = "triton-http",
    ) -> None:
        if not workload.stream:
            raise ValueError("the Triton HTTP target uses generate_stream; run it with streaming on")
        self.name = name
        self._base_url = base_url.rstrip("/")
        self._model = model
        self._workload = workload
        self._timeout = timeout
        self._url = f"{self._base_url}/v2/models/{model}/generate_stream"
        self._headers = {"content-type": "application/json"}  # the session asks for identity encoding
        self._session: aiohttp.ClientSession | None = None
        self._inputs: set[str] = set()
        self._count_tokens = False

    async def open(self, max_concurrency: int) -> None:
        self._session = http_session(max_concurrency, self._timeout)
        try:
            async with self._session.get(f"{self._base_url}/v2/models/{self._model}") as resp:
                resp.raise_for_status()
                meta = loads(await resp.read())
        except BaseException:
            await self.aclose()
            raise
        self._inputs = {i["name"] for i in meta.get("inputs", [])}
        outputs = {o["name"] for o in meta.get("outputs", [])}
        self._count_tokens = "return_num_output_tokens" in self._inputs and "num_output_tokens" in outputs

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def body(self, prompt: Prompt) -> dict[str, Any]:
        w = self._workload
        max_tokens = w.max_tokens_for(prompt)
        have = self._inputs
        body: dict[str, Any] = {"text_input": prompt.text, "max_tokens": max_tokens}
        if "stream" in have:
            body["stream"] = True
        if "exclude_input_in_output" in have:
            body["exclude_input_in_output"] = True
        if self._count_tokens:
            body["return_num_output_tokens"] = True
        if w.ignore_eos:
            for name in ("min_tokens", "min_length"):
                if name in have:
                    body[name] = max_tokens
                    break
        if w.temperature is not None and "temperature" in have:
            body["temperature"] = w.temperature
        return body

    async def send(self, prompt: Prompt) -> RequestRecord:
        session = self._session
        if session is None:
            raise RuntimeError("TritonHttpTarget.send before open()")
        content = _dumps(self.body(prompt))
        times: list[float] = []
        tokens = 0
        error: str | None = None
        error_msg: str | None = None
        count_tokens = self._count_tokens
        perf = time.perf_counter
        start = perf()
        try:
            async with session.post(self._url, data=content, headers=self._headers) as resp:
                if resp.status != 200:
                    body = await resp.read()
                    error, error_msg = f"http_{resp.status}", detail(body.decode("utf-8", "replace"))
                else:
                    parser = SSEParser()
                    async for raw in resp.content.iter_any():
                        now = perf()
                        for event in parser.feed(raw):
                            obj: Any = loads(event.data)
                            if "error" in obj:
                                error, error_msg = "stream_error", detail(obj["error"])
                                continue
                            if obj.get("text_output"):
                                times.append(now)
                            if count_tokens:
                                n = obj.get("num_output_tokens")
                                if n is not None:
                                    tokens += n[0] if isinstance(n, list) else n
                    if parser.pending and error is None:
                        error, error_msg = "incomplete_stream", "the stream ended inside an event"
        except Exception as exc:  # counted, never raised: see Target
            error, error_msg = error_kind(exc), detail(repr(exc))
        end = perf()
        return RequestRecord(
            start=start,
            end=end,
            chunk_times=tuple(times),
            output_tokens=tokens if count_tokens else len(times),
            prompt_tokens=prompt.prompt_tokens,
            usage_reported=count_tokens,
            streamed=True,
            error=error,
            error_detail=error_msg,
        )
