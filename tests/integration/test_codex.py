"""The Codex CLI (npm `@openai/codex`) completes a `codex exec` turn over the Responses API
(`wire_api = "responses"`) against the gateway as `make run` and `make run-llmapi` start it
(`gateway dev`, on the C++ repository and on the CPU stand-in of TensorRT-LLM's llmapi model: the
agent tiny model, 64k context: Codex's first request is about 12 thousand tokens, on the real CPU
Triton). Run by `make codex`, which installs the pinned Codex and sets CODEX_BIN; `make test`
leaves it out (it needs npm and the npm registry)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_process import DEV_ENGINES as ENGINES
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.codex]

KEY = "sk-codex-test"


@pytest.fixture(scope="module", params=ENGINES)
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    # `gateway dev` with the dev model's own settings (its default output limit included), so
    # what passes here is what a user of `make run` (or `make run-llmapi`) gets.
    state = tmp_path_factory.mktemp("codex") / "state"
    args = ["--engine", request.param, "--api-keys", KEY, "--access-log", "--state-dir", str(state)]
    process = GatewayProcess(args, command="dev").start(timeout=600)
    try:
        yield process
    finally:
        process.stop()


def codex_home(gateway: GatewayProcess, home: Path) -> Path:
    """A CODEX_HOME whose config.toml points Codex at the gateway, as the README shows."""
    codex = home / ".codex"
    codex.mkdir(parents=True, exist_ok=True)
    (codex / "config.toml").write_text(
        'model = "tiny"\n'
        'model_provider = "gateway"\n'
        "check_for_update_on_startup = false\n"
        "\n"
        "[model_providers.gateway]\n"
        'name = "trtllm-openai-gateway"\n'
        f'base_url = "{gateway.base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "GATEWAY_API_KEY"\n'
        "\n"
        "[analytics]\n"
        "enabled = false\n",
        encoding="utf-8",
    )
    return codex


def codex(gateway: GatewayProcess, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("CODEX_BIN")
    if not binary:
        pytest.fail("CODEX_BIN is not set: run `make codex`, which installs the Codex CLI")
    (home / "work").mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "CODEX_HOME": str(codex_home(gateway, home)),
        "GATEWAY_API_KEY": KEY,
        "RUST_LOG": "warn",
    }
    return subprocess.run(
        [binary, *args], cwd=home / "work", env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_codex_exec_completes_a_turn_over_the_responses_api(gateway: GatewayProcess, tmp_path: Path) -> None:
    run = codex(
        gateway,
        tmp_path,
        "exec",
        "--skip-git-repo-check",
        "--ephemeral",
        "--sandbox",
        "read-only",
        "--color",
        "never",
        "--json",
        "say hi",
    )
    assert run.returncode == 0, run.stdout + run.stderr + gateway.log_text()
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    types = [e.get("type") for e in events]
    assert "turn.completed" in types and "turn.failed" not in types and "error" not in types, run.stdout
    # The turn went through the Responses API, and nothing on it failed.
    access = [line for line in gateway.log_text().splitlines() if "gateway.access" in line]
    assert any("POST /v1/responses 200" in line for line in access), access
    assert not any("/v1/responses" in line and " 200 " not in line for line in access), access
