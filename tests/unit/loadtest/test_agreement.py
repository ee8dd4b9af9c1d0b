"""The load generator against a fake OpenAI / Triton SSE server with known token timings.

A real socket (uvicorn on a free port): the targets' aiohttp client speaks only to sockets, and an
in-process transport that buffers whole responses would hide the timings being measured. The official
`openai` SDK is the independent client the load generator's numbers must agree with.
"""

import asyncio
import json
import os
import socket
import statistics
import time

import pytest
import uvicorn
from openai import AsyncOpenAI

from loadtest.openai_client import OpenAITarget
from loadtest.runner import LoadSpec, run_load
from loadtest.soak import soak_open_streams
from loadtest.triton_http import TritonHttpTarget
from loadtest.workload import Prompt, Workload

TTFT = 0.05
GAP = 0.01
TOKENS = 8


def _chunk(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _read_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def fake_server(scope, receive, send):
    """OpenAI completions/chat and Triton generate_stream, scripted by the prompt text.

    Prompt words: "error" sends an error event after two tokens; "nodone" ends without [DONE];
    "nousage" omits the usage chunk; "http500" fails the request; "ragged" writes events split
    mid-line and several per write.
    """
    assert scope["type"] == "http"
    path = scope["path"]
    if scope["method"] == "GET" and path == "/v2/models/ensemble":
        meta = {
            "name": "ensemble",
            "inputs": [{"name": n} for n in ("text_input", "max_tokens", "stream", "min_tokens")],
            "outputs": [{"name": "text_output"}],
        }
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps(meta).encode()})
        return
    req = json.loads(await _read_body(receive))
    triton = path.endswith("/generate_stream")
    chat = path.endswith("/chat/completions")
    prompt = req.get("text_input") if triton else (req["messages"][-1]["content"] if chat else req["prompt"])
    n = req["max_tokens"]
    if "http500" in prompt:
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error": {"message": "scripted"}}'})
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    async def write(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    await asyncio.sleep(TTFT)
    pending = b""
    for i in range(n):
        if i:
            await asyncio.sleep(GAP)
        if "error" in prompt and i == 2:
            await write(_chunk({"error": {"message": "scripted failure", "type": "server_error"}}))
            break
        text = f" t{i}"
        if triton:
            event = _chunk({"model_name": "ensemble", "text_output": text})
        elif chat:
            event = _chunk({"choices": [{"index": 0, "delta": {"content": text}}]})
        else:
            event = _chunk({"choices": [{"index": 0, "text": text}]})
        if "ragged" in prompt:
            # Half an event now, the rest with the next one: the parser must stitch the reads.
            data = pending + event
            cut = len(data) - len(event) // 2
            pending = data[cut:]
            await write(data[:cut])
        else:
            await write(event)
    tail = pending
    if not triton and "nousage" not in prompt and req.get("stream_options", {}).get("include_usage"):
        tail += _chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
    if not triton and "nodone" not in prompt:
        tail += b": closing\n\ndata: [DONE]\n\n"
    await send({"type": "http.response.body", "body": tail})


@pytest.fixture(scope="module")
async def server_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # Idle keep-alive connections stay open: uvicorn's 5 s default closes one that a target opened and
    # then left idle while its process stalled (a full collection on a loaded machine), and the next
    # request on it is reset, which is the server's idle policy, not what these tests measure.
    config = uvicorn.Config(
        fake_server, lifespan="off", log_level="warning", access_log=False, timeout_keep_alive=600
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await task
    sock.close()


def prompts(text: str, count: int = 4) -> list[Prompt]:
    return [Prompt(text=f"{text} {i}") for i in range(count)]


async def sdk_measure(client: AsyncOpenAI, prompt: str, chat: bool) -> tuple[float, int, int]:
    """TTFT, content chunks and usage tokens as the official SDK sees them."""
    start = time.perf_counter()
    ttft = None
    chunks = usage = 0
    if chat:
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    else:
        stream = await client.completions.create(
            model="m",
            prompt=prompt,
            max_tokens=TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage.completion_tokens
        if chunk.choices:
            text = chunk.choices[0].delta.content if chat else chunk.choices[0].text
            if text:
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
    assert ttft is not None
    return ttft, chunks, usage


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_load_generator_agrees_with_the_official_sdk(server_url, endpoint):
    workload = Workload(max_tokens=TOKENS, endpoint=endpoint)
    target = OpenAITarget(server_url + "/v1", "m", workload)
    await target.open(4)
    try:
        result = await run_load(target, prompts("hello"), LoadSpec(concurrency=1, requests=4), progress=False)
    finally:
        await target.aclose()
    s = result.summary
    assert s.errors == {}
    assert s.output_tokens == 4 * TOKENS
    assert all(r.usage_reported and len(r.chunk_times) == TOKENS for r in result.records)

    # One warmed-up client, as the load generator's connection is: the SDK's first request (client
    # set-up, connect) is not what is compared, and on a loaded CI machine it can take 15 ms alone.
    async with AsyncOpenAI(base_url=server_url + "/v1", api_key="x", max_retries=0) as client:
        await sdk_measure(client, "warm-up", endpoint == "chat")
        sdk = [await sdk_measure(client, f"hello {i}", endpoint == "chat") for i in range(4)]
    assert {(c, u) for _, c, u in sdk} == {(TOKENS, TOKENS)}
    sdk_ttft = statistics.median(t for t, _, _ in sdk)
    # Same server script, same loop: the two clients' TTFTs may differ only by client overhead.
    assert s.ttft.p50 == pytest.approx(sdk_ttft, abs=0.015)
    assert s.ttft.p50 == pytest.approx(TTFT, abs=0.02)
    assert s.tpot.p50 == pytest.approx(GAP, abs=0.006)
    assert s.itl.p50 == pytest.approx(GAP, abs=0.006)


async def test_ragged_writes_parse_to_the_same_token_counts(server_url):
    target = OpenAITarget(server_url + "/v1", "m", Workload(max_tokens=TOKENS))
    await target.open(2)
    try:
        result = await run_load(
            target, prompts("ragged"), LoadSpec(concurrency=2, requests=4), progress=False
        )
    finally:
        await target.aclose()
    assert result.summary.errors == {}
    assert [r.output_tokens for r in result.records] == [TOKENS] * 4


async def test_failures_are_counted_by_kind(server_url):
    target = OpenAITarget(server_url + "/v1", "m", Workload(max_tokens=TOKENS))
    await target.open(4)
    try:
        mixed = [Prompt("error a"), Prompt("nodone b"), Prompt("http500 c"), Prompt("fine d")]
        result = await run_load(target, mixed, LoadSpec(concurrency=4, requests=4), progress=False)
    finally:
        await target.aclose()
    assert result.summary.errors == {"stream_error": 1, "incomplete_stream": 1, "http_500": 1}
    assert result.summary.successes == 1
    failed = {r.error: r.error_detail for r in result.records if r.error}
    assert "scripted failure" in failed["stream_error"]


async def test_without_usage_tokens_are_the_content_chunks(server_url):
    target = OpenAITarget(server_url + "/v1", "m", Workload(max_tokens=5))
    await target.open(1)
    try:
        result = await run_load(
            target, prompts("nousage", 2), LoadSpec(concurrency=1, requests=2), progress=False
        )
    finally:
        await target.aclose()
    assert [(r.output_tokens, r.usage_reported) for r in result.records] == [(5, False), (5, False)]


async def test_poisson_mode_sends_the_bounded_number_of_requests(server_url):
    target = OpenAITarget(server_url + "/v1", "m", Workload(max_tokens=2))
    await target.open(16)
    try:
        spec = LoadSpec(rate=200.0, requests=12, seed=3)
        result = await run_load(target, prompts("p", 3), spec, progress=False)
    finally:
        await target.aclose()
    assert result.summary.requests == 12
    assert result.summary.errors == {}
    assert result.summary.mode == "rate"


async def test_duration_bounds_a_closed_loop_run(server_url):
    target = OpenAITarget(server_url + "/v1", "m", Workload(max_tokens=TOKENS))
    await target.open(1)
    try:
        spec = LoadSpec(concurrency=1, requests=1000, duration_s=0.3)
        result = await run_load(target, prompts("d"), spec, progress=False)
    finally:
        await target.aclose()
    # Each request takes ~0.12 s: a 0.3 s budget admits at most three starts.
    assert 1 <= result.summary.requests <= 3


async def test_triton_generate_stream_target_counts_text_events(server_url):
    workload = Workload(max_tokens=TOKENS, ignore_eos=True)
    target = TritonHttpTarget(server_url, "ensemble", workload)
    await target.open(2)
    try:
        assert target.body(Prompt("x")) == {
            "text_input": "x",
            "max_tokens": TOKENS,
            "stream": True,
            "min_tokens": TOKENS,
        }
        result = await run_load(target, prompts("hi"), LoadSpec(concurrency=2, requests=4), progress=False)
    finally:
        await target.aclose()
    assert result.summary.errors == {}
    assert result.summary.output_tokens == 4 * TOKENS
    assert result.summary.ttft.p50 == pytest.approx(TTFT, abs=0.02)


async def test_soak_holds_all_streams_open_and_reports_rss(server_url):
    result = await soak_open_streams(server_url + "/v1", "m", os.getpid(), streams=40, max_tokens=TOKENS)
    assert result.ok, result.errors
    assert result.completed == 40
    # Every stream outlives the time it takes to open them all (TTFT alone is 50 ms).
    assert result.max_open == 40
    assert result.rss_before_mb > 0
    assert result.rss_peak_mb >= result.rss_before_mb
    assert result.samples
