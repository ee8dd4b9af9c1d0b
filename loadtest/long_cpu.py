"""`python -m loadtest.long_cpu`: the gateway's CPU per long chat request, in one process.

bench-long measures a whole stack (Triton, the gateway's server, a load generator) and needs
cores to itself. This measures what the gateway itself spends on one agent-sized chat request,
on any machine, busy or not: the process's CPU time (not wall time) of POSTing a conversation of
about 32k or 62k tokens to /v1/chat/completions through the app in this process (an ASGI client,
no sockets), with an engine that builds and serializes the Triton request as the engine route's
HTTP stream does (the request's JSON body, its 62k ids) and answers with one token. Each request
is the next turn of a growing conversation (one ~500-token user turn more), as bench-long's
saturation phases send them, so piece caches see what they would see in service.

Reported per tokenizer and size: CPU ms per request (median of the repeats), and with
`--profile DIR` a py-spy profile (all threads) of the measured requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench_long import AGENT, TOOL_PARSERS, Sizer, conversation_requests

_ENGINE_CONFIG = """
name: "tensorrt_llm"
backend: "tensorrtllm"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "request_output_len" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "end_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "pad_id" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "stop_words_list" data_type: TYPE_INT32 dims: [ 2, -1 ] optional: true },
  { name: "streaming" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "runtime_top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "runtime_top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "random_seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] },
  { name: "sequence_length" data_type: TYPE_INT32 dims: [ -1 ] }
]
parameters { key: "tokens_per_block" value: { string_value: "64" } }
"""


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ZeroEngine:
    """The engine route with no engine behind it: each request's Triton HTTP body is built and
    serialized (what the adapter sends), then one token comes back at once."""

    def __init__(self, tokenizer: Any) -> None:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        from gateway.triton import contract as c

        config = text_format.Parse(_ENGINE_CONFIG, model_config_pb2.ModelConfig())
        self.contract = c.read_contract(config, "engine")
        self._info = self.contract.capabilities()
        self.token = tokenizer.encode("ok", add_special_tokens=False)[0]
        self.bytes_sent = 0

    @property
    def info(self) -> Any:
        return self._info

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        from gateway.engine import GenerationDelta
        from gateway.triton.tensors import build_json_request

        body = build_json_request(
            self.contract, request, request_id="1", seed=None, num_sequences=1, stream=True
        )
        # As the HTTP client writes it (a long prompt's ids are one int32 array).
        self.bytes_sent += len(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY))
        yield GenerationDelta(index=0, token_ids=(self.token,), num_tokens=1)

    async def is_ready(self) -> bool:
        return True

    async def ensure_ready(self) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Result:
    tokenizer: str
    size: int
    tokens: int  # the measured requests' mean prompt length
    body_kb: float
    cpu_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.cpu_ms)


def _start_py_spy(out: Path) -> subprocess.Popen[bytes] | None:
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return None
    cmd = [str(spy), "record", "-r", "1000", "-f", "raw", "-o", str(out), "--pid", str(os.getpid())]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches before the measured requests start
    return proc


class ToolSizer(Sizer):
    """bench-long's sizer, sending the tools only where the chat template renders them."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.tools = tokenizer.renders_tools

    def render(self, conv: Any, messages: list[dict[str, Any]]) -> str:
        kwargs = {"tools": conv.tools} if conv.tools and self.tools else {}
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))


def _body(request: Any, *, tools: bool) -> bytes:
    body: dict[str, Any] = {
        "model": "m",
        "messages": request.messages,
        "max_tokens": 1,
        "stream": True,
        "ignore_eos": True,
    }
    if tools:
        body["tools"] = request.tools
    return orjson.dumps(body)


def tokenizer_dir(name: str) -> Path:
    from deploy import families
    from deploy.tiny_model import build_tiny_model

    if name == AGENT:
        return build_tiny_model("agent")
    path = families.tokenizer_dir(name)
    config = json.loads((path / "tokenizer_config.json").read_text())
    return path if config.get("chat_template") else families.build_family_model(name)


async def measure(
    name: str, sizes: Sequence[int], warm: int, repeats: int, users: int, profile: Path | None
) -> list[Result]:
    import httpx

    from gateway.app import create_app
    from gateway.config import ServedModel, Settings
    from gateway.text.tokenizer import Tokenizer

    path = tokenizer_dir(name)
    tokenizer = Tokenizer(path)
    sizer = ToolSizer(tokenizer)
    settings = Settings(
        models=[
            ServedModel(
                name="m",
                tokenizer=path,
                tool_parser=TOOL_PARSERS.get(name, "hermes"),
                max_model_len=65536,
            )
        ]
    )
    app = create_app(settings, engine_factory=lambda model: ZeroEngine(tokenizer))
    results = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            for size in sizes:
                # One conversation per user, each request its next turn; the users' requests of
                # a round go together (as closed-loop users answered in one engine step).
                plans = []
                for user in range(users):
                    rng = random.Random(f"long-cpu-{name}-{size}-{user}")
                    plan = conversation_requests(
                        sizer,
                        rng,
                        f"{name}-{size}-{user}",
                        start=size * 3 // 4,
                        end=size,
                        turn=500,
                        add_special=False,
                    )
                    plans.append(plan[-(warm + repeats) :])
                rounds = min(len(p) for p in plans)
                if rounds <= warm:
                    print(f"{name:>9} {size // 1000:>3}k  (its system prompt and tools alone are longer)")
                    continue
                bodies = [[_body(p[i], tools=sizer.tools) for p in plans] for i in range(rounds)]
                spy = None
                cpu: list[float] = []

                async def one(body: bytes, size: int = size) -> None:
                    resp = await client.post(
                        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
                    )
                    if resp.status_code != 200 or "[DONE]" not in resp.text or '"error"' in resp.text:
                        raise SystemExit(f"{name} {size}: HTTP {resp.status_code}: {resp.text[:300]}")

                for i, batch in enumerate(bodies):
                    if i == warm and profile is not None:
                        # py-spy sees every thread (renders and encodes run on the pool's).
                        await asyncio.to_thread(profile.mkdir, parents=True, exist_ok=True)
                        spy = _start_py_spy(profile / f"{name}-{size}.raw")
                    before = cpu_s()
                    await asyncio.gather(*(one(body) for body in batch))
                    spent = cpu_s() - before
                    if i >= warm:
                        cpu.append(spent * 1000 / len(batch))
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                measured = [r for p in plans for r in p[warm:rounds]]
                results.append(
                    Result(
                        name,
                        size,
                        sum(len(r.ids) for r in measured) // len(measured),
                        sum(len(b) for batch in bodies[warm:] for b in batch) / len(measured) / 1024,
                        cpu,
                    )
                )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizers", default="qwen3,llama3_1,gemma3,agent")
    parser.add_argument("--sizes", default="32000,62000")
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--users", type=int, default=1, help="conversations whose turns go together")
    parser.add_argument(
        "--profile", type=Path, default=None, help="write py-spy profiles (raw) of the measured requests here"
    )
    args = parser.parse_args(argv)
    # As the worker sets it (gateway.server): a thread running Python gives the loop the GIL back soon.
    sys.setswitchinterval(0.001)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU ms per request (median, min-max)")
    for name in args.tokenizers.split(","):
        for r in asyncio.run(measure(name, sizes, args.warm, args.repeats, args.users, args.profile)):
            print(
                f"{r.tokenizer:>9} {r.size // 1000:>3}k  {r.tokens:>6} tokens  {r.body_kb:6.0f} kB  "
                f"{r.median_ms:6.1f} ms  ({min(r.cpu_ms):.1f}-{max(r.cpu_ms):.1f})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
