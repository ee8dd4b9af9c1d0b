"""`python -m loadtest.bench_long` (`make bench-long`): agent-sized prompts through the gateway.

Agents (Codex, Claude Code, the Agents SDK) send a long system prompt and tool list, then grow the
conversation turn by turn: prompts of 8k to 64k tokens, a new turn every few seconds per user. This
drives that shape at one gateway worker against the synthetic engine (fixed decoding step, a
prefill cost per prompt token not reused from its KV cache), on the engine route (the gateway
renders and tokenizes; Triton gets ids), next to short streams, and the direct Triton client
(the same ids, tokenized beforehand) in the same run. Phases, each `--phase-s` long:

  short          short streams alone through the gateway (the reference for their token gaps)
  mixed          the same short streams plus the long conversations at `--long-rate` requests/s
  direct-short, direct-mixed   the same two with the direct Triton client (the engine's own share)
  saturate-32k, saturate-62k   the capacity phases: conversations at about 32k / 62k tokens, each
                 request adding one ~500-token turn, `--saturate-users` users closed loop, one output
                 token, on an engine that costs nothing per prompt token (a second engine model of
                 the same Triton, `--capacity-prefill-ms-per-token`, default 0), so the gateway is
                 what is measured: long requests/s per worker, the gateway's CPU per request and
                 its event-loop lag, and the same requests with the direct client (the ceiling)

Reported: short-stream inter-token latency p99 mixed vs short (the gateway's and the direct
client's), gateway-added TTFT of long requests (gateway minus direct, p50/p99), long requests/s
at 32k and 64k, gateway CPU per request, the gateway's event-loop lag (its own metric), and the
cost of a 500-token turn on a 60k conversation against a full encode (in this process, the
gateway's encoder). Per tokenizer: the agent tiny model, then the families' real tokenizers, each
with tools where its chat template renders them (Llama 3.1's packaged template renders none: the
project's JSON tool template is used, as `gateway dev --chat-template` takes it), without where no
template of the family does (Gemma 3).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import math
import os
import platform
import random
import re
import struct
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from loadtest import procstat
from loadtest.report import write_report
from loadtest.stats import Distribution, percentile
from loadtest.subproc import (
    NotReady,
    bench_setup,
    free_port,
    given_args,
    results_dir,
    serve_command,
    spawn_logged,
    stop_process,
    wait_http_ready,
)

if TYPE_CHECKING:
    from deploy.devstack import TritonServer

log = logging.getLogger(__name__)

AGENT = "agent"  # the agent tiny model's own tokenizer


@dataclass(frozen=True, slots=True)
class LongConfig:
    tokenizers: tuple[str, ...] = (AGENT, "qwen3", "llama3_1", "gemma3")
    phase_s: float = 20.0
    short_streams: int = 8
    short_prompt_words: int = 40
    short_max_tokens: int = 64
    long_rate: float = 1.0  # long requests per second in the mixed phase
    users: int = 4  # conversations in the mixed phase (each a turn every users / long_rate s)
    start_tokens: int = 8000  # system prompt and tools
    end_tokens: int = 62000  # the largest prompt (the agent model's context is 65,536)
    turn_tokens: int = 2000  # growth per turn in the mixed phase
    saturate_sizes: tuple[int, ...] = (32000, 62000)
    saturate_turn_tokens: int = 500
    saturate_users: int = 48
    # The capacity (saturate) phases' engine: no prefill cost, so that the gateway is the limit.
    capacity_prefill_ms_per_token: float = 0.0
    long_max_tokens: int = 8
    step_ms: float = 20.0
    prefill_ms_per_token: float = 0.001  # ~1M prompt tokens/s of context phase
    tokens_per_block: int = 64
    workers: int = 1
    out_dir: str = ""
    seed: int = 31

    @classmethod
    def quick(cls) -> LongConfig:
        """Every phase of every default tokenizer at tiny sizes (the smoke test's run)."""
        return cls(
            phase_s=2.0,
            short_streams=2,
            short_max_tokens=16,
            long_rate=2.0,
            users=2,
            start_tokens=2000,
            end_tokens=6000,
            turn_tokens=1000,
            saturate_sizes=(6000,),
            saturate_users=2,
            long_max_tokens=2,
            step_ms=10.0,
        )


# ------------------------------------------------------------------------------------------ workload

_SENTENCE = (
    "the function returns a value when the config file is missing so we read the defaults from "
    "environment and log an error with the path then retry after the lock is released by the "
    "worker thread; tests cover parsing of JSON input (nested lists, unicode: é, 数字) and the CLI"
)
_WORDS = tuple(_SENTENCE.split())
_CODE = (
    "def handle(request):\n    data = json.loads(request.body)\n    if not data.get('id'):\n"
    '        raise ValueError(\'missing id\')\n    return {"ok": True, "count": len(data)}\n'
)


def _text(rng: random.Random, words: int) -> str:
    parts: list[str] = []
    for i in range(words):
        parts.append(rng.choice(_WORDS))
        if i % 97 == 96:
            parts.append("\n\n" + _CODE)
    return " ".join(parts)


def tools(rng: random.Random, count: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": _text(rng, 60),
                "parameters": {
                    "type": "object",
                    "properties": {
                        f"arg_{j}": {"type": "string", "description": _text(rng, 12)} for j in range(4)
                    },
                    "required": ["arg_0"],
                },
            },
        }
        for i in range(count)
    ]


@dataclass(slots=True)
class Conversation:
    """One agent session: its system prompt and tools, then alternating user and assistant turns."""

    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]

    def request(self, user_words: int, rng: random.Random) -> list[dict[str, Any]]:
        """The messages of the next turn's request (the turn's user message appended)."""
        self.messages.append({"role": "user", "content": _text(rng, user_words)})
        return list(self.messages)

    def answer(self, rng: random.Random, words: int = 60) -> None:
        # What the model said (the synthetic engine's text is noise): an agent sends it back.
        self.messages.append({"role": "assistant", "content": _text(rng, words)})


class Sizer:
    """Words of workload text per token of one tokenizer, and prompt lengths, measured with it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        sample = _text(random.Random(0), 4000)
        self.words_per_token = 4000 / len(tokenizer.encode(sample, add_special_tokens=False))

    def words(self, tokens: int) -> int:
        return max(1, int(tokens * self.words_per_token))

    def render(self, conv: Conversation, messages: list[dict[str, Any]]) -> str:
        kwargs = {"tools": conv.tools} if conv.tools else {}
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))


def new_conversation(
    sizer: Sizer, rng: random.Random, tokens: int, salt: str, *, with_tools: bool = True
) -> Conversation:
    """A session whose rendered system prompt and tools hold about `tokens` tokens (about a quarter
    of them tools, when the template renders tools). The tools are measured as the template renders
    them (their JSON costs more tokens than their words) and the system prompt fills the rest, so
    that a conversation starts at its size and not a quarter above it. The probe has a user turn:
    some templates (Llama 3.1's) write the tools into the first one."""
    tool_list = tools(rng, max(1, tokens // 4 // 130)) if with_tools else []
    head = f"Session {salt}. You are a coding agent.\n"
    probe = Conversation(tool_list, [{"role": "system", "content": head}, {"role": "user", "content": "go"}])
    rendered = len(sizer.tokenizer.encode(sizer.render(probe, probe.messages), add_special_tokens=False))
    system = head + _text(rng, sizer.words(max(tokens - rendered, tokens // 4)))
    return Conversation(tool_list, [{"role": "system", "content": system}])


@dataclass(frozen=True, slots=True)
class LongRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    ids: list[int]  # as the gateway encodes the rendered prompt (for the direct client)


def conversation_requests(
    sizer: Sizer,
    rng: random.Random,
    salt: str,
    *,
    start: int,
    end: int,
    turn: int,
    add_special: bool,
    with_tools: bool = True,
) -> list[LongRequest]:
    """One conversation's requests, growing from about `start` to about `end` tokens."""
    conv = new_conversation(sizer, rng, start, salt, with_tools=with_tools)
    out: list[LongRequest] = []
    while True:
        messages = conv.request(sizer.words(turn - 80), rng)
        text = sizer.render(conv, messages)
        ids = sizer.tokenizer.encode(text, add_special_tokens=add_special)
        if len(ids) > end:
            break
        out.append(LongRequest(messages, conv.tools, ids))
        conv.answer(rng)
    return out


# --------------------------------------------------------------------------------------------- stack


@dataclass(frozen=True, slots=True)
class Stack:
    grpc_url: str
    http_url: str
    engine: str
    # The capacity phases' engine model (the same synthetic engine, its own prefill cost).
    capacity_engine: str
    model_dir: Path
    triton_pid: int | None


@contextlib.contextmanager
def serve_triton(
    repositories: Sequence[Path], workdir: Path, ready_timeout_s: float = 180.0
) -> Iterator[TritonServer]:
    """One Triton serving `repositories` (working in workdir/triton) as the benchmarks run it:
    with the HTTP send buffer that keeps generate_stream from losing responses under load."""
    from deploy import devstack

    server = devstack.TritonServer(
        repositories, work_dir=workdir / "triton", http_send_buffer=devstack.TRITON_HTTP_SEND_BUFFER
    )
    server.start()
    try:
        server.wait_ready(ready_timeout_s)
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def start_stack(cfg: LongConfig, workdir: Path) -> Iterator[Stack]:
    from deploy.model_repo import render_repository
    from deploy.tiny_model import DEV_KIND, build_tiny_model

    model_dir = build_tiny_model(DEV_KIND)

    def engine_repository(name: str, prefix: str, prefill_ms_per_token: float) -> Path:
        # The engine model alone: the gateway sends it ids on the engine route, and so does the
        # direct client (an ensemble's tokenizer models would only cost memory and start-up).
        return render_repository(
            workdir / name,
            backend="cpu",
            variant="current",
            variables={
                "tokenizer_dir": str(model_dir),
                "model_dir": str(model_dir),
                "engine_mode": "synthetic",
                "enable_kv_cache_reuse": True,
                "synthetic_step_ms": cfg.step_ms,
                "synthetic_prefill_ms_per_token": prefill_ms_per_token,
                "tokens_per_block": cfg.tokens_per_block,
                "max_active_requests": 1024,
                "name_prefix": prefix,
            },
            models=("tensorrt_llm",),
            overwrite=True,
        )

    repo = engine_repository("model_repo", "", cfg.prefill_ms_per_token)
    # The capacity phases' engine beside it in the same Triton, with its own prefill cost.
    capacity = engine_repository("capacity_repo", CAPACITY_PREFIX, cfg.capacity_prefill_ms_per_token)
    with serve_triton([repo, capacity], workdir) as server:
        yield Stack(
            server.grpc_url,
            server.http_url,
            "tensorrt_llm",
            f"{CAPACITY_PREFIX}tensorrt_llm",
            model_dir,
            server.pid,
        )


CAPACITY_PREFIX = "capacity_"
CAPACITY_MODEL = "capacity"


@dataclass(frozen=True, slots=True)
class TokenizerSetup:
    """One tokenizer's directory and the chat template the gateway serves it with (None: its own)."""

    directory: Path
    chat_template: Path | None = None


# The project's tool templates for families whose packaged chat template renders no tools (as
# `gateway dev --chat-template` takes them; written after the formats the model makers document).
TOOL_TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "chat_templates"
TOOL_TEMPLATES = {"llama3_1": "llama3_1_json_tools.jinja"}


def tokenizer_dirs(cfg: LongConfig, stack: Stack) -> dict[str, TokenizerSetup]:
    """Each tokenizer's directory: the agent tiny model's, the families' (deploy.families) with a
    chat template (the family's tiny model where its package ships none), and the tool template of
    a family whose own renders none."""
    from deploy import families

    dirs: dict[str, TokenizerSetup] = {}
    for name in cfg.tokenizers:
        if name == AGENT:
            dirs[name] = TokenizerSetup(stack.model_dir)
            continue
        if name not in families.FAMILIES:
            raise ValueError(f"unknown tokenizer {name!r}: {AGENT} or one of {', '.join(families.FAMILIES)}")
        try:
            path = families.tokenizer_dir(name)
            config = json.loads((path / "tokenizer_config.json").read_text())
            directory = path if config.get("chat_template") else families.build_family_model(name)
        except (families.FamilyFetchError, OSError, ValueError) as exc:
            log.warning("the %s tokenizer is not available (%s): left out", name, exc)
            continue
        template = TOOL_TEMPLATES.get(name)
        dirs[name] = TokenizerSetup(directory, TOOL_TEMPLATES_DIR / template if template else None)
    return dirs


# How each tokenizer's model writes tool calls (the gateway refuses tools without a parser).
TOOL_PARSERS = {"llama3_1": "llama3_json"}


@contextlib.asynccontextmanager
async def start_gateway(
    cfg: LongConfig, stack: Stack, name: str, setup: TokenizerSetup, workdir: Path
) -> AsyncIterator[Gateway]:
    port = free_port()

    def spec(model: str, engine: str) -> str:
        template = f"chat_template={setup.chat_template}," if setup.chat_template else ""
        return (
            f"name={model},triton_model={engine},tokenizer={setup.directory},{template}route=engine,"
            f"engine_model={engine},tool_parser={TOOL_PARSERS.get(name, 'hermes')},"
            # The engine's context (the agent tiny model's), not the tokenizer's own (Gemma 3's: 32k).
            "max_model_len=65536"
        )

    cmd = serve_command(
        port,
        stack.grpc_url,
        spec("m", stack.engine),
        http_url=stack.http_url,
        workers=cfg.workers,
        extra=["--model", spec(CAPACITY_MODEL, stack.capacity_engine)],
    )
    async with serve_gateway(cmd, port, workdir / f"gateway-{name}.log") as gateway:
        yield gateway


@dataclass(slots=True)
class Gateway:
    base: str
    pid: int
    session: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def serve_gateway(
    cmd: list[str], port: int, log_path: Path, ready_timeout_s: float = 300.0
) -> AsyncIterator[Gateway]:
    """`cmd` (a `serve_command` on `port`) run offline in its own process group, its output in
    `log_path`; once it is ready, a client session without a connection limit to load it with."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = spawn_logged(cmd, log_path, env)
    try:
        await asyncio.to_thread(
            wait_http_ready, proc, f"http://127.0.0.1:{port}/health/ready", ready_timeout_s, log_path
        )
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
        ) as session:
            yield Gateway(f"http://127.0.0.1:{port}", proc.pid, session)
    finally:
        stop_process(proc)


# ------------------------------------------------------------------------------------------- clients


@dataclass(slots=True)
class Record:
    kind: str  # "short" or "long"
    start: float
    chunk_times: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    def gaps(self) -> list[float]:
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]


async def gateway_chat(
    gw: Gateway,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_tokens: int,
    kind: str,
    model: str = "m",
) -> Record:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    if tools:
        body["tools"] = tools
    record = Record(kind, time.perf_counter())
    try:
        async with gw.session.post(
            gw.base + "/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"content-type": "application/json"},
        ) as resp:
            if resp.status != 200:
                record.error = f"http {resp.status}: {(await resp.text())[:200]}"
                return record
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    record.chunk_times.append(time.perf_counter())
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        record.error = repr(exc)
    return record


class Direct:
    """The engine model over Triton gRPC streaming, with ids tokenized beforehand: the floor."""

    def __init__(self, url: str, model: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._pb = service_pb2
        self._channel = grpc.aio.insecure_channel(
            url,
            options=[
                ("grpc.max_send_message_length", 2**31 - 1),
                ("grpc.max_receive_message_length", 2**31 - 1),
            ],
        )
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._model = model

    async def close(self) -> None:
        await self._channel.close()

    def _request(self, ids: Sequence[int], max_tokens: int) -> Any:
        pb = self._pb
        req = pb.ModelInferRequest(model_name=self._model)

        def add(name: str, dtype: str, shape: list[int], raw: bytes) -> None:
            t = req.inputs.add()
            t.name, t.datatype = name, dtype
            t.shape.extend(shape)
            req.raw_input_contents.append(raw)

        add("input_ids", "INT32", [1, len(ids)], struct.pack(f"<{len(ids)}i", *ids))
        add("input_lengths", "INT32", [1, 1], struct.pack("<i", len(ids)))
        add("request_output_len", "INT32", [1, 1], struct.pack("<i", max_tokens))
        add("min_tokens", "INT32", [1, 1], struct.pack("<i", max_tokens))
        add("streaming", "BOOL", [1, 1], b"\x01")
        req.outputs.add().name = "output_ids"
        req.parameters["triton_enable_empty_final_response"].bool_param = True
        return req

    async def generate(self, ids: Sequence[int], max_tokens: int, kind: str) -> Record:
        request = self._request(ids, max_tokens)
        done = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield request
            await done.wait()

        record = Record(kind, time.perf_counter(), prompt_tokens=len(ids))
        call = self._stub.ModelStreamInfer(requests(), timeout=600)
        try:
            async for message in call:
                if message.error_message:
                    record.error = message.error_message[:200]
                    break
                response = message.infer_response
                if response.raw_output_contents and len(response.raw_output_contents[0]) >= 4:
                    record.chunk_times.append(time.perf_counter())
                params = response.parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    break
        except Exception as exc:  # counted, not raised
            record.error = repr(exc)[:200]
        finally:
            done.set()
            call.cancel()
        return record


# ------------------------------------------------------------------------------------------- phases


@dataclass(slots=True)
class PhaseResult:
    name: str
    target: str  # "gateway" or "direct"
    duration_s: float
    records: list[Record]
    gateway_cpu_s: float = math.nan
    loop_lag: dict[str, float] = field(default_factory=dict)  # bucket upper bound -> count

    def of(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind and r.error is None]

    def errors(self) -> int:
        return sum(r.error is not None for r in self.records)


def _lag_buckets(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'gateway_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


async def scrape_lag(gw: Gateway) -> dict[str, float]:
    async with gw.session.get(gw.base + "/metrics") as resp:
        return _lag_buckets(await resp.text())


def lag_quantile(before: dict[str, float], after: dict[str, float], q: float) -> tuple[float, int]:
    """The bucket bound (seconds) holding quantile q of the lag samples taken between two scrapes,
    and how many samples there were."""
    bounds = sorted(((math.inf if k == "+Inf" else float(k)), after[k] - before.get(k, 0.0)) for k in after)
    total = bounds[-1][1] if bounds else 0.0
    if total <= 0:
        return math.nan, 0
    for bound, cumulative in bounds:
        if cumulative >= q * total:
            return bound, int(total)
    return math.inf, int(total)


async def run_phase(
    name: str,
    *,
    cfg: LongConfig,
    gw: Gateway | None,
    direct: Direct | None,
    short_messages: list[dict[str, Any]] | None,
    short_ids: list[int] | None,
    long_plan: list[list[LongRequest]] | None,
    long_rate: float,
    closed_loop_long: int = 0,
    duration_s: float,
    model: str = "m",
) -> PhaseResult:
    """Short streams closed loop (if any), long requests open loop at `long_rate` (each user its
    conversation in order) or `closed_loop_long` users back to back, for `duration_s`."""
    target = "gateway" if gw is not None else "direct"
    records: list[Record] = []
    stop_at = time.perf_counter() + duration_s

    async def one(kind: str, req: LongRequest | None, max_tokens: int) -> Record:
        if gw is not None:
            if req is None:
                assert short_messages is not None
                return await gateway_chat(gw, short_messages, None, max_tokens, kind)
            record = await gateway_chat(gw, req.messages, req.tools, max_tokens, kind, model)
            record.prompt_tokens = len(req.ids)
            return record
        assert direct is not None
        ids = short_ids if req is None else req.ids
        assert ids is not None
        return await direct.generate(ids, max_tokens, kind)

    async def short_loop() -> None:
        while time.perf_counter() < stop_at:
            records.append(await one("short", None, cfg.short_max_tokens))

    async def open_user(plan: list[LongRequest], offset: float, interval: float) -> None:
        await asyncio.sleep(offset)
        i = 0
        tasks = []
        next_at = time.perf_counter()
        while time.perf_counter() < stop_at and i < len(plan):
            tasks.append(asyncio.create_task(one("long", plan[i], cfg.long_max_tokens)))
            i += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        for rec in await asyncio.gather(*tasks):
            records.append(rec)

    # Closed loop: the window is measured once every user's first request (a whole new prompt,
    # which warms its conversation up and is not counted) is done, for `duration_s` from there, so
    # that a burst of dozens of whole prompts does not count against the rate.
    closed_users = long_plan[:closed_loop_long] if long_plan and closed_loop_long else []
    warm = {"left": len(closed_users)}
    warmed = asyncio.Event()
    window: dict[str, Any] = {}

    async def closed_user(plan: list[LongRequest]) -> None:
        records.append(await one("warm", plan[0], 1))
        warm["left"] -= 1
        if not warm["left"]:
            window["t0"] = time.perf_counter()
            window["stop"] = window["t0"] + duration_s
            window["cpu0"] = procstat.cpu_times(gw.pid) if gw is not None else None
            warmed.set()
        await warmed.wait()
        for req in plan[1:]:
            if time.perf_counter() >= window["stop"]:
                break
            records.append(await one("long", req, 1))

    before_lag = await scrape_lag(gw) if gw is not None else {}
    cpu0 = procstat.cpu_times(gw.pid) if gw is not None else None
    t0 = time.perf_counter()
    jobs: list[Any] = []
    if short_messages is not None or short_ids is not None:
        jobs += [short_loop() for _ in range(cfg.short_streams)]
    if long_plan:
        if closed_loop_long:
            jobs += [closed_user(p) for p in closed_users]
        else:
            users = len(long_plan)
            interval = users / long_rate
            jobs += [open_user(p, i * interval / users, interval) for i, p in enumerate(long_plan)]
    await asyncio.gather(*jobs)
    if closed_users:
        # The window after the warm-up: its requests/s and the gateway's CPU per request.
        t0, cpu0 = window["t0"], window["cpu0"]
    elapsed = time.perf_counter() - t0
    result = PhaseResult(name, target, elapsed, records)
    if gw is not None and cpu0 is not None:
        result.gateway_cpu_s = (procstat.cpu_times(gw.pid) - cpu0).total_s
        after = await scrape_lag(gw)
        result.loop_lag = {k: after[k] - before_lag.get(k, 0.0) for k in after}
    return result


# ------------------------------------------------------------------------------------------- figures


def incremental_cost(
    tokenizer: Any, rng: random.Random, sizer: Sizer, size: int = 58000, *, with_tools: bool = True
) -> dict[str, float]:
    """A 500-token turn on a conversation of about `size` tokens (~60k by default): the gateway's
    encode (cached pieces) against a full encode of the same prompt, in this process (medians of 5)."""
    conv = new_conversation(sizer, rng, size // 5, "incremental", with_tools=with_tools)
    while True:
        messages = conv.request(sizer.words(size // 24), rng)
        if len(tokenizer.encode(sizer.render(conv, messages), add_special_tokens=False)) > size:
            break
        conv.answer(rng, max(20, size // 150))
    fulls, increments, tokens = [], [], 0
    for _ in range(5):
        conv.answer(rng, 20)
        messages = conv.request(sizer.words(480), rng)
        text = sizer.render(conv, messages)
        backend = tokenizer._tok._tokenizer
        t0 = time.perf_counter()
        want = backend.encode(text, add_special_tokens=False).ids
        fulls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = tokenizer.encode(text, add_special_tokens=False)
        increments.append(time.perf_counter() - t0)
        if list(want) != got:
            raise AssertionError("incremental ids differ from a full encode")
        tokens = len(got)
    full, inc = sorted(fulls)[2], sorted(increments)[2]
    return {"tokens": tokens, "full_ms": full * 1e3, "incremental_ms": inc * 1e3, "ratio": inc / full}


def summarize(
    name: str, phases: dict[str, PhaseResult], incremental: dict[str, float], workers: int = 1
) -> dict[str, Any]:
    def p99_gap(phase: str) -> float:
        gaps = [g for r in phases[phase].of("short") for g in r.gaps()] if phase in phases else []
        return percentile(gaps, 99.0) if gaps else math.nan

    def ttft(phase: str) -> Distribution:
        return Distribution.of(r.ttft for r in phases[phase].of("long") if r.ttft is not None)

    out: dict[str, Any] = {"tokenizer": name, "incremental": incremental}
    out["itl_p99_short_ms"] = p99_gap("short") * 1e3
    out["itl_p99_mixed_ms"] = p99_gap("mixed") * 1e3
    out["itl_ratio"] = p99_gap("mixed") / p99_gap("short")
    out["direct_itl_p99_short_ms"] = p99_gap("direct-short") * 1e3
    out["direct_itl_p99_mixed_ms"] = p99_gap("direct-mixed") * 1e3
    out["direct_itl_ratio"] = p99_gap("direct-mixed") / p99_gap("direct-short")
    gw, dr = ttft("mixed"), ttft("direct-mixed")
    out["long_ttft_ms"] = {"p50": gw.p50 * 1e3, "p99": gw.p99 * 1e3}
    out["direct_long_ttft_ms"] = {"p50": dr.p50 * 1e3, "p99": dr.p99 * 1e3}
    out["added_ttft_ms"] = {"p50": (gw.p50 - dr.p50) * 1e3, "p99": (gw.p99 - dr.p99) * 1e3}
    mixed = phases["mixed"]
    longs = mixed.of("long")
    out["mixed_long_requests"] = len(longs)
    out["mixed_long_rate"] = len(longs) / mixed.duration_s
    out["mixed_mean_prompt_tokens"] = sum(r.prompt_tokens for r in phases["direct-mixed"].of("long")) / max(
        1, len(phases["direct-mixed"].of("long"))
    )
    lag_p99, samples = lag_quantile({}, mixed.loop_lag, 0.99)
    out["loop_lag_p99_ms_at_most"] = lag_p99 * 1e3
    out["loop_lag_samples"] = samples
    out["errors"] = {k: v.errors() for k, v in phases.items() if v.errors()}
    out["saturate"] = {}
    for key, phase in phases.items():
        if not key.startswith("saturate"):
            continue
        counted = phase.of("long")
        rate = len(counted) / phase.duration_s if phase.duration_s > 0 else math.nan
        entry = out["saturate"].setdefault(key.removeprefix("saturate-").removesuffix("-direct"), {})
        ttft_p50 = Distribution.of(r.ttft for r in counted if r.ttft is not None).p50 * 1e3
        if key.endswith("-direct"):
            entry["direct_rps"] = rate
            entry["direct_ttft_p50_ms"] = ttft_p50
        else:
            # Per worker: the workers share the closed-loop users.
            entry["rps"] = rate / workers
            entry["requests"] = len(counted)
            # The window's CPU (after the warm-up) over the requests it counted.
            entry["cpu_ms_per_request"] = phase.gateway_cpu_s * 1e3 / len(counted) if counted else math.nan
            lag, _ = lag_quantile({}, phase.loop_lag, 0.99)
            entry["loop_lag_p99_ms_at_most"] = lag * 1e3
            entry["ttft_p50_ms"] = ttft_p50
            entry["prompt_tokens"] = max((r.prompt_tokens for r in counted), default=0)
    return out


async def bench_tokenizer(
    cfg: LongConfig, stack: Stack, name: str, setup: TokenizerSetup, workdir: Path
) -> dict[str, Any]:
    from gateway.text.tokenizer import Tokenizer

    tokenizer = Tokenizer(setup.directory, chat_template_file=setup.chat_template)
    # Agents send tools; a family none of whose templates renders them is measured without.
    with_tools = tokenizer.renders_tools
    if not with_tools:
        log.info("%s: its chat template renders no tools: conversations without tools", name)
    sizer = Sizer(tokenizer)
    rng = random.Random(f"{cfg.seed}-{name}")
    add_special = False  # chat templates write their own BOS (the gateway's add_special_tokens default)
    salt = f"{name}-{time.time_ns()}"
    log.info("%s: building conversations", name)
    short_messages = [{"role": "user", "content": _text(rng, cfg.short_prompt_words)}]
    short_ids = tokenizer.encode(
        sizer.render(Conversation([], []), short_messages), add_special_tokens=add_special
    )

    def plans(users: int, start: int, end: int, turn: int, tag: str) -> list[list[LongRequest]]:
        out = []
        for u in range(users):
            reqs = conversation_requests(
                sizer,
                rng,
                f"{salt}-{tag}-{u}",
                start=start,
                end=end,
                turn=turn,
                add_special=add_special,
                with_tools=with_tools,
            )
            # Users are spread over the conversation's length: some near the start, some near the end.
            shift = len(reqs) * u // users
            out.append(reqs[shift:] + reqs[:shift])
        return out

    phases: dict[str, PhaseResult] = {}
    async with start_gateway(cfg, stack, name, setup, workdir) as gw:
        direct = Direct(stack.grpc_url, stack.engine)
        capacity_direct = Direct(stack.grpc_url, stack.capacity_engine)
        try:
            common = {"cfg": cfg, "long_rate": cfg.long_rate, "duration_s": cfg.phase_s}
            # Warm both paths (connections, first requests) outside the measured phases.
            await run_phase(
                "warm",
                gw=gw,
                direct=None,
                short_messages=short_messages,
                short_ids=None,
                long_plan=None,
                **{**common, "duration_s": 1.0},
            )
            mixed_plan = plans(cfg.users, cfg.start_tokens, cfg.end_tokens, cfg.turn_tokens, "mixed")
            for phase, kwargs in (
                (
                    "short",
                    {
                        "gw": gw,
                        "direct": None,
                        "short_messages": short_messages,
                        "short_ids": None,
                        "long_plan": None,
                    },
                ),
                (
                    "mixed",
                    {
                        "gw": gw,
                        "direct": None,
                        "short_messages": short_messages,
                        "short_ids": None,
                        "long_plan": mixed_plan,
                    },
                ),
                (
                    "direct-short",
                    {
                        "gw": None,
                        "direct": direct,
                        "short_messages": None,
                        "short_ids": short_ids,
                        "long_plan": None,
                    },
                ),
                (
                    "direct-mixed",
                    {
                        "gw": None,
                        "direct": direct,
                        "short_messages": None,
                        "short_ids": short_ids,
                        "long_plan": plans(
                            cfg.users, cfg.start_tokens, cfg.end_tokens, cfg.turn_tokens, "mixed-direct"
                        ),
                    },
                ),
            ):
                log.info("%s: phase %s", name, phase)
                phases[phase] = await run_phase(phase, **kwargs, **common)  # type: ignore[arg-type]
            for size in cfg.saturate_sizes:
                label = f"{size // 1000}k"
                # The same conversations for the gateway and then the direct client: the same ids
                # to the same engine (and each conversation's prompts built once).
                users = [
                    conversation_requests(
                        sizer,
                        rng,
                        f"{salt}-sat{label}-{u}",
                        # Growing by one turn per request up to the size, from three quarters of it.
                        start=size * 3 // 4,
                        end=size,
                        turn=cfg.saturate_turn_tokens,
                        add_special=add_special,
                        with_tools=with_tools,
                    )
                    for u in range(cfg.saturate_users)
                ]
                users = [u for u in users if len(u) >= 2]
                for suffix, g, d in (("", gw, None), ("-direct", None, capacity_direct)):
                    log.info("%s: phase saturate-%s%s", name, label, suffix)
                    phases[f"saturate-{label}{suffix}"] = await run_phase(
                        f"saturate-{label}{suffix}",
                        gw=g,
                        direct=d,
                        short_messages=None,
                        short_ids=None,
                        long_plan=users,
                        closed_loop_long=len(users),
                        model=CAPACITY_MODEL,
                        **common,
                    )
        finally:
            await direct.close()
            await capacity_direct.close()
    incremental = incremental_cost(
        tokenizer, rng, sizer, min(58000, cfg.end_tokens * 15 // 16), with_tools=with_tools
    )
    summary = summarize(name, phases, incremental, cfg.workers)
    summary["tools"] = with_tools
    summary["raw"] = {
        k: {
            "duration_s": v.duration_s,
            "records": len(v.records),
            "errors": v.errors(),
            "gateway_cpu_s": v.gateway_cpu_s,
            "first_error": next((r.error for r in v.records if r.error), None),
        }
        for k, v in phases.items()
    }
    return summary


# ------------------------------------------------------------------------------------------- report


def fmt(x: Any, digits: int = 1) -> str:
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.{digits}f}"
    return str(x)


def verdicts(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows:
        name = row["tokenizer"]
        ratio = row["itl_ratio"]
        out.append(
            f"- {name}: short-stream ITL p99 with long prompts / without: {fmt(ratio, 2)}x "
            f"(target <= 1.2x at ~{fmt(row['mixed_long_rate'], 2)} long requests/s of mean "
            f"{fmt(row['mixed_mean_prompt_tokens'] / 1000, 1)}k tokens): "
            f"{'met' if ratio <= 1.2 else 'not met'} (direct client: {fmt(row['direct_itl_ratio'], 2)}x)"
        )
        lags = [row["loop_lag_p99_ms_at_most"]] + [
            v.get("loop_lag_p99_ms_at_most", math.nan) for v in row["saturate"].values()
        ]
        worst = max((x for x in lags if not math.isnan(x)), default=math.nan)
        out.append(
            f"- {name}: event-loop lag p99 <= {fmt(worst, 1)} ms, worst phase (target < 5 ms): "
            f"{'met' if worst < 5.0 else 'not met'}"
        )
        inc = row["incremental"]
        if inc:
            out.append(
                f"- {name}: a ~500-token turn on a {inc['tokens'] / 1000:.0f}k conversation: "
                f"{inc['incremental_ms']:.2f} ms vs {inc['full_ms']:.1f} ms full encode = "
                f"{inc['ratio'] * 100:.1f}% (target < 10%): "
                f"{'met' if inc['ratio'] < 0.10 else 'not met'}"
            )
        for size, entry in row["saturate"].items():
            if "rps" in entry:
                target = ""
                if size.startswith("6"):
                    target = (
                        f" (target >= 80/s per worker: {'met' if entry['rps'] >= 80 else 'not met'} here)"
                    )
                out.append(
                    f"- {name}: growing conversations at ~{size} tokens: {entry['rps']:.1f} requests/s per "
                    f"worker (direct client, same engine: {fmt(entry.get('direct_rps', math.nan))}/s)"
                    + target
                )
    return out


def markdown(cfg: LongConfig, rows: Sequence[dict[str, Any]], started: str) -> str:
    cpu = platform.processor() or platform.machine()
    machine = f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [
        f"# bench-long {started}",
        "",
        f"Machine: {machine}. Load generator, gateway ({cfg.workers} worker) and Triton share it.",
        f"Workload: conversations from {cfg.start_tokens // 1000}k to {cfg.end_tokens // 1000}k tokens "
        f"(system prompt and tools, then ~{cfg.turn_tokens}-token turns) at {cfg.long_rate:g} long "
        f"requests/s from {cfg.users} users, beside {cfg.short_streams} short streams "
        f"({cfg.short_max_tokens} tokens); synthetic engine step {cfg.step_ms:g} ms, prefill "
        f"{cfg.prefill_ms_per_token:g} ms per uncached token, engine route; phases of {cfg.phase_s:g} s. "
        f"Tools where the tokenizer's chat template renders them: "
        + ", ".join(f"{r['tokenizer']} {'yes' if r.get('tools') else 'no'}" for r in rows)
        + ".",
        "",
        "| tokenizer | ITL p99 short ms | with long ms | ratio | direct ratio | long TTFT p50/p99 ms "
        "| added by gateway p50/p99 ms | loop lag p99 ms (<=) | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokenizer']} | {fmt(r['itl_p99_short_ms'])} | {fmt(r['itl_p99_mixed_ms'])} | "
            f"{fmt(r['itl_ratio'], 2)}x | {fmt(r['direct_itl_ratio'], 2)}x | "
            f"{fmt(r['long_ttft_ms']['p50'])}/{fmt(r['long_ttft_ms']['p99'])} | "
            f"{fmt(r['added_ttft_ms']['p50'])}/{fmt(r['added_ttft_ms']['p99'])} | "
            f"{fmt(r['loop_lag_p99_ms_at_most'])} | {sum(r['errors'].values())} |"
        )
    lines += [
        "",
        f"Capacity: {cfg.saturate_users} conversations back to back (closed loop, one output token, each "
        f"request one ~{cfg.saturate_turn_tokens}-token turn longer) on an engine with "
        f"{cfg.capacity_prefill_ms_per_token:g} ms of prefill per prompt token, so the gateway is the limit; "
        "the direct Triton client sends the same ids to the same engine.",
        "",
        "| tokenizer | size | long req/s per worker | direct req/s | gateway CPU ms/request "
        "| TTFT p50 ms | direct TTFT p50 ms | loop lag p99 ms (<=) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for size, e in r["saturate"].items():
            lines.append(
                f"| {r['tokenizer']} | {size} | {fmt(e.get('rps', math.nan))} | "
                f"{fmt(e.get('direct_rps', math.nan))} | {fmt(e.get('cpu_ms_per_request', math.nan), 2)} | "
                f"{fmt(e.get('ttft_p50_ms', math.nan))} | {fmt(e.get('direct_ttft_p50_ms', math.nan))} | "
                f"{fmt(e.get('loop_lag_p99_ms_at_most', math.nan))} |"
            )
    lines += ["", "## Against the targets", "", *verdicts(rows), ""]
    return "\n".join(lines)


def write(out: Path, cfg: LongConfig, rows: Sequence[dict[str, Any]], started: str) -> str:
    text = markdown(cfg, rows, started)
    write_report(out, "bench_long", text, {"config": asdict(cfg), "started": started, "rows": rows})
    return text


async def run(cfg: LongConfig, out: Path, started: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with start_stack(cfg, out / "work") as stack:
        for name, setup in tokenizer_dirs(cfg, stack).items():
            rows.append(await bench_tokenizer(cfg, stack, name, setup, out / "work"))
            write(out, cfg, rows, started)  # each tokenizer's figures as soon as they are known
    return rows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench_long",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: every phase and tokenizer, small prompts, 2 s phases"
    )
    p.add_argument("--tokenizers", help=f"comma list (default {','.join(LongConfig().tokenizers)})")
    p.add_argument("--phase-s", type=float, help="seconds per phase")
    p.add_argument("--long-rate", type=float, help="long requests/s in the mixed phase")
    p.add_argument("--users", type=int, help="conversations in the mixed phase")
    p.add_argument("--saturate-users", type=int, help="conversations back to back in the saturation phases")
    p.add_argument("--workers", type=int, help="gateway workers (default 1)")
    p.add_argument(
        "--prefill-ms-per-token", type=float, help="the engine's prefill cost in the short/mixed phases"
    )
    p.add_argument(
        "--capacity-prefill-ms-per-token",
        type=float,
        help="the capacity (saturate) phases' engine's prefill cost (default 0: the gateway is measured)",
    )
    p.add_argument("--out", help="results directory (default results/long-<timestamp>)")
    return p


def config_from_args(args: argparse.Namespace) -> LongConfig:
    cfg = LongConfig.quick() if args.quick else LongConfig()
    changes = given_args(
        args,
        "phase_s",
        "long_rate",
        "users",
        "saturate_users",
        "workers",
        "prefill_ms_per_token",
        "capacity_prefill_ms_per_token",
        out="out_dir",
    )
    if args.tokenizers:
        changes["tokenizers"] = tuple(t.strip() for t in args.tokenizers.split(",") if t.strip())
    return replace(cfg, **changes)


def main(argv: Sequence[str] | None = None) -> int:
    bench_setup()
    cfg = config_from_args(build_parser().parse_args(argv))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = results_dir(cfg.out_dir, "long")
    try:
        rows = asyncio.run(run(cfg, out, started))
    except NotReady as exc:
        log.error("a server did not start: %s", exc)
        return 1
    text = write(out, cfg, rows, started)
    sys.stdout.write(text + "\n")
    log.info("results in %s/", out)
    failed = sum(sum(r["errors"].values()) for r in rows)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
