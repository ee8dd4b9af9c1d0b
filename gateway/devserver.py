"""`gateway dev`: the whole embedded stack on one machine with no GPU.

The CPU tritonserver (with the reference engine) runs in a child process (`python -m
deploy.devstack`), so this process, the gateway, never imports torch; it is stopped with the
gateway, leaving no orphans.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from gateway.config import ServedModel, Settings
from gateway.server import check_port_free, load_tokenizers, run_server

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600
DEV_DEFAULT_MAX_TOKENS = 64


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
            sys.stdout.write(line)
            if line.startswith("READY "):
                ready = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
                break
    finally:
        timer.cancel()
    if not ready:
        fail()
    # Keep draining the child's output so it never blocks on a full pipe.
    threading.Thread(target=lambda: [sys.stdout.write(line) for line in child.stdout], daemon=True).start()  # type: ignore[union-attr]
    return child, ready


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
    # Before Triton's start-up (many seconds): a taken port is one line at once.
    check_port_free(settings.host, settings.port)
    model_dir = Path(args.model_dir) if args.model_dir else _tiny_model_dir()
    # uvicorn re-raises SIGTERM once it has shut down; with the default handler that would end
    # the process before `finally` stops the Triton stack.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    child, ready = _start_triton(model_dir, args)
    try:
        served = ServedModel(
            name=args.served_name,
            tokenizer=model_dir,
            triton_model=ready["ensemble"],
            tool_parser=args.tool_parser,
            reasoning_parser=args.reasoning_parser,
            # The random tiny model rarely ends by itself, and agents set no output limit.
            default_max_tokens=DEV_DEFAULT_MAX_TOKENS,
            # ... and a turn cut there still ends as completed: agents (Codex, the Agents SDK)
            # treat an incomplete response as an error.
            default_limit_status="completed",
        )
        settings = settings.model_copy(
            update={"models": [served], "triton_url": [ready["grpc"]], "triton_http_url": [ready["http"]]}
        )
        tokenizers = load_tokenizers(settings)
        base = f"http://{settings.host}:{settings.port}"

        def announce() -> None:
            print(
                f"gateway: serving `{served.name}` on {base}/v1 (Triton gRPC {ready['grpc']}, "
                f"HTTP {ready['http']}, "
                f"tokenizer {model_dir}). Try:\n"
                f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json' "
                f'-d \'{{"model": "{served.name}", "messages": [{{"role": "user", "content": "Hello!"}}], '
                f'"max_tokens": 32}}\'\n'
                f"  gateway check --triton-url {ready['grpc']} "
                f"--model name={served.name},tokenizer={model_dir}"
                + ("" if served.triton_model == "ensemble" else f",triton_model={served.triton_model}"),
                flush=True,
            )

        run_server(settings, tokenizers=tokenizers, on_listening=announce)
    finally:
        _stop(child)
