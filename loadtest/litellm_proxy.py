"""The LiteLLM proxy with its Triton provider, in its own venv (never the project's: its pins differ).

The venv is built once under .cache/ and reused; the proxy runs as a subprocess pointed at
Triton's `/v2/models/<model>/generate` (the provider streams through `generate_stream`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadtest.subproc import NotReady, stop_process, wait_http_ready

log = logging.getLogger(__name__)

LITELLM_REQUIREMENT = "litellm[proxy]==1.106.2"
DEFAULT_VENV = Path(".cache/litellm-venv")


class LiteLLMUnavailable(RuntimeError):
    """LiteLLM could not be installed or started; the message is what the report shows."""


@dataclass(frozen=True, slots=True)
class LiteLLMProxy:
    pid: int
    base_url: str  # OpenAI base URL, with /v1
    api_key: str
    log_path: Path


def ensure_venv(venv: Path = DEFAULT_VENV, requirement: str = LITELLM_REQUIREMENT) -> Path:
    """The proxy executable, installing LiteLLM into its own venv on first use."""
    venv = venv.absolute()  # the proxy runs in its own working directory
    exe = venv / "bin" / "litellm"
    stamp = venv / ".installed"
    if exe.exists() and stamp.exists() and stamp.read_text().strip() == requirement:
        return exe
    venv.parent.mkdir(parents=True, exist_ok=True)
    log.info("installing %s into %s (once)", requirement, venv)
    try:
        # The base interpreter, not the project venv's: a venv made from a venv links back into it.
        base_python = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", requirement],
            check=True,
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or exc.stdout or "").strip().splitlines()[-5:]
        raise LiteLLMUnavailable(f"pip install {requirement} failed: {' | '.join(tail)}") from None
    except subprocess.TimeoutExpired:
        raise LiteLLMUnavailable(f"pip install {requirement} timed out") from None
    stamp.write_text(requirement + "\n")
    return exe


def write_config(path: Path, served_name: str, triton_http_url: str, triton_model: str) -> None:
    api_base = f"{triton_http_url.rstrip('/')}/v2/models/{triton_model}/generate"
    # Retries off: a failing request must show up as an error, not as a slower success.
    path.write_text(
        "model_list:\n"
        f"  - model_name: {served_name}\n"
        "    litellm_params:\n"
        f"      model: triton/{triton_model}\n"
        f"      api_base: {api_base}\n"
        "litellm_settings:\n"
        "  num_retries: 0\n"
        "  request_timeout: 600\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
        "router_settings:\n"
        "  num_retries: 0\n"
    )


@contextlib.contextmanager
def run_proxy(
    *,
    exe: Path,
    workdir: Path,
    port: int,
    triton_http_url: str,
    triton_model: str = "ensemble",
    served_name: str = "tiny",
    ready_timeout: float = 120.0,
) -> Iterator[LiteLLMProxy]:
    """Start the proxy, wait until it answers, yield it, stop it (and its children)."""
    # The proxy runs with workdir as its cwd: a relative path would be resolved twice.
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "litellm_config.yaml"
    write_config(config, served_name, triton_http_url, triton_model)
    key = "sk-bench-" + secrets.token_hex(16)
    env = {
        **os.environ,
        # A master key is mandatory for the proxy to start; a random one is as good as any here.
        "LITELLM_MASTER_KEY": key,
        # No network: use the bundled model cost map instead of fetching it.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
    }
    log_path = workdir / "litellm.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                str(exe),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            try:
                wait_http_ready(proc, f"{base}/health/liveliness", ready_timeout, log_path)
            except NotReady as exc:
                raise LiteLLMUnavailable(f"LiteLLM proxy did not start: {exc}") from None
            yield LiteLLMProxy(pid=proc.pid, base_url=f"{base}/v1", api_key=key, log_path=log_path)
        finally:
            stop_process(proc)
