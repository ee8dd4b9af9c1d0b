"""`python -m loadtest.bench_images` (`make bench-images`): text streams while images arrive.

A vision-language request carries megabytes the gateway must decode from base64, sniff, measure and
check (pixel caps) before anything reaches Triton; done on the event loop, that work would stall
every other stream the worker serves. This measures it the way a user sees it: one gateway worker
serving two models from one Triton,

  text   the native engine (synthetic tokens at a fixed step from a Triton backend in C), on the
         engine route: the text streams, whose token gaps show any stall of the gateway;
  vlm    the tiny vision-language model (Gemma 3's tokenizer and template, a one-layer vision
         tower) in TensorRT-LLM's multimodal repository layout on the CPU engine (`--vlm-engine
         llmapi`: the stand-in of the llmapi model with `image_url`), taking
         ~1-megapixel JPEGs as `data:` URIs in OpenAI `image_url` parts,

and alternates two phases, each `--phase-s` long, `--rounds` times:

  alone    `--text-streams` streams back to back (closed loop), nothing else
  images   the same streams, plus image requests arriving open loop at `--image-rate` per second

Reported: the text streams' inter-token gap p99 with images over without (target within 1.2x),
their p50, the image requests' TTFT and errors, the gateway's CPU per image request and its
event-loop lag. On a small machine Triton's own image work (the processor, the vision tower) shares
the cores with the synthetic engine's clock, so the ratio there includes the engine host's share;
the gateway's own share is its CPU time and event-loop lag.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import itertools
import logging
import math
import os
import platform
import random
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from loadtest import procstat
from loadtest.bench_long import Gateway, fmt, lag_quantile, scrape_lag, serve_gateway, serve_triton
from loadtest.report import write_report
from loadtest.stats import Distribution
from loadtest.subproc import (
    NotReady,
    bench_setup,
    free_port,
    given_args,
    results_dir,
    serve_command,
)

log = logging.getLogger(__name__)

TARGET_RATIO = 1.2


@dataclass(frozen=True, slots=True)
class ImagesConfig:
    phase_s: float = 20.0
    rounds: int = 3
    text_streams: int = 8
    text_prompt_words: int = 40
    text_max_tokens: int = 64
    step_ms: float = 20.0  # the synthetic engine's decoding step
    image_rate: float = 1.0  # image requests per second in the images phase
    image_width: int = 1155  # 1155 x 866: one megapixel, 4:3
    image_height: int = 866
    images_per_request: int = 1
    image_max_tokens: int = 8
    distinct_images: int = 8  # JPEGs cycled through (each request a different one from the last)
    jpeg_quality: int = 90
    vlm: str = "gemma3"
    # cpp: the CPU stand-in of the C++ multimodal repository (the gateway renders the template and
    # counts the image tokens); llmapi: the stand-in of the llmapi model with image_url.
    vlm_engine: str = "cpp"
    ready_timeout_s: float = 900.0
    workers: int = 1
    out_dir: str | None = None

    @classmethod
    def quick(cls) -> ImagesConfig:
        return cls(phase_s=3.0, rounds=1, text_streams=2, text_max_tokens=16, step_ms=10.0, distinct_images=2)


# ------------------------------------------------------------------------------------------ workload


def jpeg(cfg: ImagesConfig, seed: int) -> bytes:
    """A photo-like JPEG of the configured size: smooth gradients and shapes with some grain, so
    its size is a camera picture's (a few hundred kB), not a flat colour's or pure noise's."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = random.Random(seed)
    w, h = cfg.image_width, cfg.image_height
    img = Image.linear_gradient("L").resize((w, h)).convert("RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(40):
        x, y = rng.randrange(w), rng.randrange(h)
        r = rng.randrange(20, max(21, w // 5))
        fill = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(2))
    grain = Image.effect_noise((w, h), 24).convert("RGB")
    img = Image.blend(img, grain, 0.15)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=cfg.jpeg_quality)
    return buf.getvalue()


def text_prompt(words: int) -> str:
    rng = random.Random(7)
    vocab = ("the", "a", "model", "stream", "token", "image", "engine", "gateway", "batch", "answer", "fox")
    return "Summarize: " + " ".join(rng.choice(vocab) for _ in range(words))


# ------------------------------------------------------------------------------------------ the stack


@dataclass(frozen=True, slots=True)
class Stack:
    grpc_url: str
    http_url: str
    text_ensemble: str
    text_engine: str
    text_tokenizer: Path
    vlm_ensemble: str
    vlm_dir: Path


@contextlib.contextmanager
def start_stack(cfg: ImagesConfig, workdir: Path) -> Iterator[Stack]:
    from deploy import devstack
    from deploy.tiny_vlm import build_vlm_model

    # The text model on the native engine (a token clock in C): no Python models to load, and a
    # Triton cost per token far below the gateway's, so the streams' gaps show the gateway.
    text = devstack.prepare_dev_repository(
        workdir / "text_repo",
        engine_mode="native",
        variables={"synthetic_step_ms": cfg.step_ms, "name_prefix": "text_"},
    )
    vlm_dir = build_vlm_model(cfg.vlm)
    if cfg.vlm_engine == "llmapi":
        vlm = devstack.prepare_llmapi_repository(workdir / "vlm_repo", model_dir=vlm_dir)
    else:
        vlm = devstack.prepare_dev_repository(workdir / "vlm_repo", model_dir=vlm_dir, engine_mode="model")
    # Four Python models load one after another: minutes on a busy small machine.
    with serve_triton([text.path, vlm.path], workdir, cfg.ready_timeout_s) as server:
        yield Stack(
            server.grpc_url,
            server.http_url,
            text.ensemble,
            text.ensemble,
            text.model_dir,
            vlm.ensemble,
            vlm_dir,
        )


@contextlib.asynccontextmanager
async def start_gateway(cfg: ImagesConfig, stack: Stack, workdir: Path) -> AsyncIterator[Gateway]:
    port = free_port()
    text_spec = (
        f"name=text,triton_model={stack.text_ensemble},tokenizer={stack.text_tokenizer},route=engine,"
        f"engine_model={stack.text_engine}"
    )
    vlm_spec = f"name=vlm,triton_model={stack.vlm_ensemble},tokenizer={stack.vlm_dir}"
    cmd = serve_command(
        port,
        stack.grpc_url,
        text_spec,
        http_url=stack.http_url,
        workers=cfg.workers,
        extra=["--model", vlm_spec],
    )
    async with serve_gateway(cmd, port, workdir / "gateway.log") as gateway:
        yield gateway


# ------------------------------------------------------------------------------------------- clients


@dataclass(slots=True)
class Record:
    kind: str  # "text" or "image"
    start: float
    chunk_times: list[float] = field(default_factory=list)
    end: float = math.nan
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.start if self.chunk_times else None

    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.chunk_times)]


async def stream_chat(gw: Gateway, body: dict[str, Any], kind: str) -> Record:
    """One streamed chat completion; a chunk with content is a token's arrival."""
    record = Record(kind, time.perf_counter())
    try:
        async with gw.session.post(
            gw.base + "/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"content-type": "application/json"},
        ) as resp:
            if resp.status != 200:
                record.error = f"http {resp.status}: {(await resp.text())[:300]}"
                return record
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                chunk = orjson.loads(line[6:])
                if chunk.get("error"):
                    record.error = f"stream error: {chunk['error']}"[:300]
                    break
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    record.chunk_times.append(time.perf_counter())
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        record.error = repr(exc)
    record.end = time.perf_counter()
    if record.error is None and not record.chunk_times:
        record.error = "no content"
    return record


def text_body(cfg: ImagesConfig) -> dict[str, Any]:
    return {
        "model": "text",
        "messages": [{"role": "user", "content": text_prompt(cfg.text_prompt_words)}],
        "max_tokens": cfg.text_max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


def image_body(cfg: ImagesConfig, uris: Sequence[str]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in the picture?"}]
    parts += [{"type": "image_url", "image_url": {"url": uri}} for uri in uris]
    return {
        "model": "vlm",
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": cfg.image_max_tokens,
        "stream": True,
        "temperature": 0,
    }


@dataclass(slots=True)
class PhaseResult:
    name: str
    duration_s: float
    records: list[Record]
    gateway_cpu_s: float = math.nan
    lag_p99_s: float = math.nan
    lag_samples: int = 0

    def ok(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind and r.error is None]

    def errors(self, kind: str) -> list[str]:
        return [r.error for r in self.records if r.kind == kind and r.error is not None]


async def run_phase(
    name: str, cfg: ImagesConfig, gw: Gateway, uris: Sequence[str], *, images: bool
) -> PhaseResult:
    """The text streams closed loop for `cfg.phase_s`; with `images`, image requests open loop at
    `cfg.image_rate` per second beside them (all awaited before the phase ends)."""
    records: list[Record] = []
    stop_at = time.perf_counter() + cfg.phase_s
    body = text_body(cfg)
    counter = itertools.count()

    async def text_loop() -> None:
        while time.perf_counter() < stop_at:
            records.append(await stream_chat(gw, body, "text"))

    async def image_arrivals() -> None:
        tasks = []
        interval = 1.0 / cfg.image_rate
        next_at = time.perf_counter() + interval / 2
        while True:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            if time.perf_counter() >= stop_at:
                break
            i = next(counter)
            picked = [
                uris[(i * cfg.images_per_request + k) % len(uris)] for k in range(cfg.images_per_request)
            ]
            tasks.append(asyncio.create_task(stream_chat(gw, image_body(cfg, picked), "image")))
            next_at += interval
        records.extend(await asyncio.gather(*tasks))

    lag_before = await scrape_lag(gw)
    cpu0 = procstat.cpu_times(gw.pid)
    t0 = time.perf_counter()
    jobs = [text_loop() for _ in range(cfg.text_streams)]
    if images:
        jobs.append(image_arrivals())
    await asyncio.gather(*jobs)
    result = PhaseResult(name, time.perf_counter() - t0, records)
    result.gateway_cpu_s = (procstat.cpu_times(gw.pid) - cpu0).total_s
    result.lag_p99_s, result.lag_samples = lag_quantile(lag_before, await scrape_lag(gw), 0.99)
    return result


# ------------------------------------------------------------------------------------------- figures


def summarize(cfg: ImagesConfig, phases: Sequence[PhaseResult], image_bytes: int) -> dict[str, Any]:
    """Pooled over the rounds: every text gap of each phase kind, every image request."""

    def pooled(name: str) -> list[PhaseResult]:
        return [p for p in phases if p.name == name]

    def gaps(name: str) -> Distribution:
        return Distribution.of(g * 1000 for p in pooled(name) for r in p.ok("text") for g in r.gaps())

    alone, mixed = gaps("alone"), gaps("images")
    image_records = [r for p in pooled("images") for r in p.ok("image")]
    image_errors = [e for p in pooled("images") for e in p.errors("image")]
    text_errors = [e for p in phases for e in p.errors("text")]
    images_sent = len(image_records) + len(image_errors)

    def cpu_per_s(name: str) -> float:
        ps = pooled(name)
        return sum(p.gateway_cpu_s for p in ps) / max(1e-9, sum(p.duration_s for p in ps))

    extra_cpu = (cpu_per_s("images") - cpu_per_s("alone")) * sum(p.duration_s for p in pooled("images"))
    lags = [p.lag_p99_s for p in phases if not math.isnan(p.lag_p99_s)]
    return {
        "text_itl_ms": {"alone": asdict(alone), "images": asdict(mixed)},
        "itl_p99_ratio": mixed.p99 / alone.p99 if alone.p99 > 0 else math.nan,
        "itl_p50_ratio": mixed.p50 / alone.p50 if alone.p50 > 0 else math.nan,
        "text_requests": sum(len(p.ok("text")) for p in phases),
        "text_errors": text_errors[:5],
        "text_error_count": len(text_errors),
        "image_requests": images_sent,
        "image_errors": image_errors[:5],
        "image_error_count": len(image_errors),
        "image_rate_achieved": images_sent / max(1e-9, sum(p.duration_s for p in pooled("images"))),
        "image_ttft_ms": asdict(Distribution.of((r.ttft or math.nan) * 1000 for r in image_records)),
        "image_latency_ms": asdict(Distribution.of((r.end - r.start) * 1000 for r in image_records)),
        "mean_image_bytes": image_bytes,
        "gateway_cpu_ms_per_image_request": extra_cpu * 1000 / images_sent if images_sent else math.nan,
        "loop_lag_p99_ms_at_most": max(lags) * 1000 if lags else math.nan,
    }


def verdict(row: dict[str, Any]) -> str:
    ratio = row["itl_p99_ratio"]
    met = not math.isnan(ratio) and ratio <= TARGET_RATIO and row["image_error_count"] == 0
    return (
        f"text streams' inter-token p99 with ~1 MP JPEG requests / alone: {fmt(ratio, 2)}x "
        f"(target <= {TARGET_RATIO}x): {'met' if met else 'not met'}"
    )


def markdown(cfg: ImagesConfig, row: dict[str, Any], started: str) -> str:
    cpu = platform.processor() or platform.machine()
    alone, mixed = row["text_itl_ms"]["alone"], row["text_itl_ms"]["images"]
    lines = [
        "# Text streams while images arrive",
        "",
        f"Run {started} on {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; one gateway "
        f"worker; {cfg.rounds} rounds of {cfg.phase_s:g} s phases; {cfg.text_streams} text streams of "
        f"{cfg.text_max_tokens} tokens on the native engine ({cfg.step_ms:g} ms step); image requests at "
        f"{cfg.image_rate:g}/s, {cfg.images_per_request} x {cfg.image_width}x{cfg.image_height} JPEG "
        f"(mean {row['mean_image_bytes'] / 1000:.0f} kB) as data: URIs, to the tiny {cfg.vlm} VLM on "
        f"{'the llmapi model' if cfg.vlm_engine == 'llmapi' else 'the C++ multimodal repository'}.",
        "",
        f"- {verdict(row)}",
        "",
        "| text inter-token gap (ms) | count | p50 | p90 | p99 | max |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {d['count']} | {fmt(d['p50'], 2)} | {fmt(d['p90'], 2)} | {fmt(d['p99'], 2)} | "
            f"{fmt(d['max'], 2)} |"
            for name, d in (("alone", alone), ("with images", mixed))
        ),
        "",
        f"- image requests: {row['image_requests']} ({fmt(row['image_rate_achieved'], 2)}/s), "
        f"errors {row['image_error_count']}; TTFT p50 {fmt(row['image_ttft_ms']['p50'])} ms, p99 "
        f"{fmt(row['image_ttft_ms']['p99'])} ms",
        f"- gateway CPU per image request (images phase minus alone, per request): "
        f"{fmt(row['gateway_cpu_ms_per_image_request'])} ms",
        f"- gateway event-loop lag p99, worst phase: <= {fmt(row['loop_lag_p99_ms_at_most'])} ms",
        f"- text requests: {row['text_requests']}, errors {row['text_error_count']}",
    ]
    if row["image_errors"] or row["text_errors"]:
        lines += ["", "Errors (first few):", *(f"- `{e}`" for e in row["image_errors"] + row["text_errors"])]
    return "\n".join(lines) + "\n"


async def run(cfg: ImagesConfig, out: Path, started: str) -> dict[str, Any]:
    images = [jpeg(cfg, seed) for seed in range(cfg.distinct_images)]
    uris = ["data:image/jpeg;base64," + base64.b64encode(b).decode("ascii") for b in images]
    mean_bytes = sum(map(len, images)) // len(images)
    log.info(
        "%d JPEGs of %dx%d, mean %d kB", len(images), cfg.image_width, cfg.image_height, mean_bytes // 1000
    )
    phases: list[PhaseResult] = []
    with start_stack(cfg, out / "work") as stack:
        async with start_gateway(cfg, stack, out / "work") as gw:
            # Warm both paths (first requests load the processor, compile, fill caches).
            warm = await asyncio.gather(
                stream_chat(gw, text_body(cfg), "text"), stream_chat(gw, image_body(cfg, uris[:1]), "image")
            )
            for record in warm:
                if record.error:
                    log.warning("warm-up %s request failed: %s", record.kind, record.error)
            for round_ in range(cfg.rounds):
                for name, with_images in (("alone", False), ("images", True)):
                    log.info("round %d/%d: %s", round_ + 1, cfg.rounds, name)
                    phases.append(await run_phase(name, cfg, gw, uris, images=with_images))
    row = summarize(cfg, phases, mean_bytes)
    row["config"] = asdict(cfg)
    row["started"] = started
    return row


def write(out: Path, cfg: ImagesConfig, row: dict[str, Any], started: str) -> str:
    text = markdown(cfg, row, started)
    write_report(out, "bench_images", text, row)
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtest.bench_images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 3 s phases, 2 text streams")
    p.add_argument("--phase-s", type=float, help="seconds per phase")
    p.add_argument("--rounds", type=int, help="alone/images phase pairs (pooled)")
    p.add_argument("--text-streams", type=int, help="concurrent text streams")
    p.add_argument("--image-rate", type=float, help="image requests per second in the images phase")
    p.add_argument("--images-per-request", type=int)
    p.add_argument("--image-size", help="WIDTHxHEIGHT of the JPEGs (default 1155x866, one megapixel)")
    p.add_argument("--step-ms", type=float, help="the synthetic engine's decoding step")
    p.add_argument("--workers", type=int, help="gateway workers (default 1)")
    p.add_argument(
        "--vlm-engine",
        choices=("cpp", "llmapi"),
        help="the VLM's contract (default cpp: the multimodal ensemble)",
    )
    p.add_argument("--out", help="results directory (default results/images-<timestamp>)")
    return p


def config_from_args(args: argparse.Namespace) -> ImagesConfig:
    cfg = ImagesConfig.quick() if args.quick else ImagesConfig()
    changes = given_args(
        args,
        "phase_s",
        "rounds",
        "text_streams",
        "image_rate",
        "images_per_request",
        "step_ms",
        "workers",
        "vlm_engine",
        out="out_dir",
    )
    if args.image_size:
        width, _, height = args.image_size.lower().partition("x")
        changes["image_width"], changes["image_height"] = int(width), int(height)
    cfg = replace(cfg, **changes)
    if cfg.image_rate <= 0 or cfg.rounds < 1 or cfg.text_streams < 1 or cfg.images_per_request < 1:
        raise SystemExit("--image-rate, --rounds, --text-streams and --images-per-request must be positive")
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    bench_setup()
    cfg = config_from_args(build_parser().parse_args(argv))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    out = results_dir(cfg.out_dir, "images")
    try:
        row = asyncio.run(run(cfg, out, started))
    except NotReady as exc:
        log.error("a server did not start: %s", exc)
        return 1
    sys.stdout.write(write(out, cfg, row, started))
    log.info("results in %s/", out)
    failed = row["image_error_count"] + row["text_error_count"]
    return 1 if failed or not row["image_requests"] else 0


if __name__ == "__main__":
    sys.exit(main())
