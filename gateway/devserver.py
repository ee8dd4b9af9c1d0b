"""`gateway dev`: the whole embedded stack on one machine with no GPU.

The CPU tritonserver (with the reference engine) runs in a child process (`python -m
deploy.devstack`), so this process, the gateway, never imports torch; it is stopped with the
gateway, leaving no orphans.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gateway.config import ServedModel, Settings
from gateway.errors import ServerConfigError
from gateway.invocation import gateway_command
from gateway.server import StartupError, check_port_free, load_tokenizers, run_server
from gateway.text.tokenizer import check_tokenizer_files

DEV_LORA_CACHE_ADAPTERS = 8

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600
# The output limit of a request that sets none. The random tiny model ends a reply by itself after
# about two thousand tokens on average (a few seconds on a CPU), so agents' turns end with the
# model's own end of sequence; this only bounds the rare reply that runs on, and such a cut is
# reported as one (finish_reason "length", status "incomplete", stop_reason "max_tokens").
DEV_DEFAULT_MAX_TOKENS = 16384


def _tiny_model_dir() -> Path:
    # The `agent` kind: a 64k-token context and a real vocabulary, so agent clients' prompts fit.
    out = subprocess.run(
        [sys.executable, "-m", "deploy.tiny_model", "--kind", "agent"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def _start_triton(model_dir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[str], dict[str, str]]:
    cmd = [
        sys.executable,
        "-m",
        "deploy.devstack",
        "--model-dir",
        str(model_dir),
        "--variant",
        args.variant,
        "--engine-mode",
        args.engine_mode,
        "--engine",
        args.engine,
        "--llmapi-profile",
        args.llmapi_profile,
    ]
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_die_with_parent
    )
    assert child.stdout is not None
    ready: dict[str, str] = {}

    def fail() -> None:
        child.wait()
        raise SystemExit(f"gateway dev: the Triton stack did not start (exit code {child.returncode})")

    timer = threading.Timer(READY_TIMEOUT_S, child.terminate)
    timer.start()
    try:
        for line in child.stdout:
            if line.startswith("READY "):
                ready = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
                break
            sys.stdout.write(line)
    finally:
        timer.cancel()
    if not ready:
        fail()
    # The Triton stack's own READY line is for programs; the user's one ready line is the
    # gateway's, once it serves: this one says what is still to come.
    print(
        f"gateway dev: Triton started (gRPC {ready['grpc']}, HTTP {ready['http']}, log {ready['log']}); "
        "starting the gateway",
        flush=True,
    )
    # Keep draining the child's output so it never blocks on a full pipe.
    threading.Thread(target=lambda: [sys.stdout.write(line) for line in child.stdout], daemon=True).start()  # type: ignore[union-attr]
    return child, ready


def ready_banner(
    base: str,
    name: str,
    triton: dict[str, str],
    model_dir: Path,
    gateway: str,
    *,
    tiny: bool,
    triton_model: str = "ensemble",
) -> str:
    """The dev stack's one ready line, printed once the gateway serves, and what to try with it.
    The commands in it run as printed from the directory `gateway dev` was started in; `tiny`:
    the model is the random tiny model, whose text is said to be what it is."""
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32})
    model_spec = f"name={name},tokenizer={model_dir}"
    if triton_model != "ensemble":
        model_spec += f",triton_model={triton_model}"
    return (
        f"Ready: the gateway serves `{name}` at {base}/v1 (Triton gRPC {triton['grpc']}, "
        f"HTTP {triton['http']}; tokenizer {model_dir}). Try:\n"
        f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}\n"
        f"  {gateway} check --triton-url {triton['grpc']} "
        f"--model {shlex.quote(model_spec)}"
    ) + (
        f"\n`{name}` is a random model: its replies are gibberish, often with U+FFFD where a token is "
        "part of a UTF-8 character that the next token does not complete (the gateway decodes the "
        "token ids exactly)."
        if tiny
        else ""
    )


def model_task_of(model_dir: Path) -> str:
    from gateway.core.pooling import detect_task

    return detect_task(model_dir)


def _serve_encoder(
    settings: Settings, args: argparse.Namespace, model_dir: Path, ready: dict[str, str]
) -> None:
    """An encoder's directory: the gateway serves its ids-in model (or, with --encoder-input text,
    the text-in one) for /v1/embeddings, or /v1/rerank and /v1/score."""
    triton_model = ready["ensemble"]
    if args.encoder_input == "text" and triton_model == "embedding":
        triton_model = "embedding_text"
    served = ServedModel(name=args.served_name, tokenizer=model_dir, triton_model=triton_model)
    settings = settings.model_copy(
        update={"models": [served], "triton_url": [ready["grpc"]], "triton_http_url": [ready["http"]]}
    )
    tokenizers = load_tokenizers(settings)
    base = f"http://{settings.host}:{settings.port}"
    if model_task_of(model_dir) == "embed":
        body = json.dumps({"model": served.name, "input": ["Hello!", "Hello there"]})
        try_line = f"  curl {base}/v1/embeddings -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    else:
        body = json.dumps({"model": served.name, "query": "Hello?", "documents": ["Hello!", "Goodbye."]})
        try_line = f"  curl {base}/v1/rerank -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    banner = (
        f"Ready: the gateway serves `{served.name}` at {base}/v1 (Triton gRPC {ready['grpc']}, "
        f"Triton model {triton_model}; tokenizer {model_dir}). Try:\n{try_line}"
    )
    run_server(settings, tokenizers=tokenizers, on_ready=lambda: print(banner, flush=True))


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel sends it SIGTERM if the gateway dies, even by
    SIGKILL, so the Triton stack never outlives it (Linux prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)


def _stop(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_dev(settings: Settings, args: argparse.Namespace) -> None:
    # Before Triton's start-up (many seconds): a taken port or a wrong --model-dir is one line at once.
    check_port_free(settings.host, settings.port)
    if args.model_dir:
        try:
            check_tokenizer_files(args.model_dir)
        except ServerConfigError as exc:
            raise StartupError(f"--model-dir: {exc.message}") from None
    if args.chat_template and not Path(args.chat_template).is_file():
        raise StartupError(f"--chat-template: {args.chat_template}: No such file")
    model_dir = Path(args.model_dir) if args.model_dir else _tiny_model_dir()
    # uvicorn re-raises SIGTERM once it has shut down; with the default handler that would end
    # the process before `finally` stops the Triton stack.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    child, ready = _start_triton(model_dir, args)
    try:
        if model_task_of(model_dir) != "generate":
            _serve_encoder(settings, args, model_dir, ready)
            return
        served = ServedModel(
            name=args.served_name,
            tokenizer=model_dir,
            triton_model=ready["ensemble"],
            tool_parser=args.tool_parser,
            reasoning_parser=args.reasoning_parser,
            chat_template=args.chat_template,
            default_max_tokens=DEV_DEFAULT_MAX_TOKENS,
        )
        update: dict[str, object] = {
            "models": [served],
            "triton_url": [ready["grpc"]],
            "triton_http_url": [ready["http"]],
            # The stack's queue and KV-cache gauges join the model-server metrics on /metrics.
            "triton_metrics_url": [ready["metrics"]],
        }
        if args.engine == "cpp" and settings.lora_max_running is None:
            # The CPU engine's LoRA cache: deploy/model_repo.py's lora_cache_adapters default.
            update["lora_max_running"] = DEV_LORA_CACHE_ADAPTERS
        settings = settings.model_copy(update=update)
        tokenizers = load_tokenizers(settings)
        base = f"http://{settings.host}:{settings.port}"
        banner = ready_banner(
            base,
            served.name,
            ready,
            model_dir,
            gateway_command(),
            tiny=args.model_dir is None,
            triton_model=served.triton_model,
        )
        run_server(settings, tokenizers=tokenizers, on_ready=lambda: print(banner, flush=True))
    finally:
        _stop(child)
