"""Claude Code (npm `@anthropic-ai/claude-code`) completes a `claude -p` turn against the gateway
as `make run` and `make run-llmapi` start it (`gateway dev`, on the C++ repository and on the CPU
stand-in of TensorRT-LLM's llmapi model: the agent tiny model, 64k context: Claude Code's prompt is
about 16 thousand tokens, on the real CPU Triton). Run by `make claude-code`, which installs the
pinned Claude Code and sets CLAUDE_CODE_BIN; `make test` leaves it out (it needs npm and the npm
registry). A second stack serves the tiny vision-language model (`gateway dev --model-dir`, its
agent variant, whose sampled replies end on their own) on both engines: Claude Code reads a PNG
file in the turn and sends it as an `image` block."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gateway_process import DEV_ENGINES as ENGINES
from tests.support.gateway_process import GatewayProcess

pytestmark = [pytest.mark.integration, pytest.mark.claude_code]

KEY = "sk-claude-code-test"


@pytest.fixture(scope="module", params=ENGINES)
def gateway(request: pytest.FixtureRequest) -> Iterator[GatewayProcess]:
    # `gateway dev` with the dev model's own settings (its default output limit included), so
    # what passes here is what a user of `make run` (or `make run-llmapi`) gets.
    args = ["--engine", request.param, "--api-keys", KEY, "--access-log"]
    process = GatewayProcess(args, command="dev").start(timeout=600)
    try:
        yield process
    finally:
        process.stop()


def claude(
    gateway: GatewayProcess, home: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("CLAUDE_CODE_BIN")
    if not binary:
        pytest.fail("CLAUDE_CODE_BIN is not set: run `make claude-code`, which installs Claude Code")
    (home / "work").mkdir(parents=True, exist_ok=True)
    env = {
        **(env or {}),
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": gateway.base_url,
        "ANTHROPIC_API_KEY": KEY,
        # No telemetry, update checks or other calls to Anthropic's services: only the gateway.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    return subprocess.run(
        [binary, *args], cwd=home / "work", env=env, capture_output=True, text=True, timeout=600, check=False
    )


def test_claude_code_completes_a_print_mode_turn(gateway: GatewayProcess, tmp_path: Path) -> None:
    run = claude(gateway, tmp_path, "-p", "Say hello", "--model", "tiny", "--output-format", "json")
    assert run.returncode == 0, run.stdout + run.stderr + gateway.log_text()
    result = json.loads(run.stdout)
    assert result["type"] == "result" and result["subtype"] == "success" and result["is_error"] is False, (
        result
    )
    # The model ended its turn itself: no reply was cut at an output limit.
    assert result["stop_reason"] == "end_turn", result
    # The turn went through the Messages API, streamed, and nothing on it failed.
    access = [line for line in gateway.log_text().splitlines() if "gateway.access" in line]
    assert any("POST /v1/messages 200" in line for line in access), access
    assert not any("/v1/messages" in line and " 200 " not in line for line in access), access


@pytest.fixture(scope="module", params=ENGINES)
def vlm_gateway(request: pytest.FixtureRequest) -> Iterator[tuple[GatewayProcess, str]]:
    from deploy.tiny_vlm import build_vlm_model

    # Gemma 3's own template, which refuses turns that do not alternate: Claude Code sends user turns
    # in a row (its reminder, then the prompt with the picture), which the Messages API merges as
    # Anthropic's does. The agent variant: Claude Code samples at temperature 1 and fails a reply
    # cut at its output limit, and the default tiny VLM (two end tokens among 262k random logits)
    # practically never ends a sampled reply; the variant's end tokens take a few percent a step.
    args = ["--engine", request.param, "--model-dir", str(build_vlm_model("gemma3-agent"))]
    process = GatewayProcess([*args, "--api-keys", KEY, "--access-log"], command="dev").start(timeout=900)
    try:
        yield process, request.param
    finally:
        process.stop()


def test_claude_code_reads_a_png_file_in_a_turn(
    vlm_gateway: tuple[GatewayProcess, str], tmp_path: Path
) -> None:
    from tests.support.images import image_bytes

    gateway, engine = vlm_gateway
    work = tmp_path / "work"
    work.mkdir(parents=True)
    (work / "chart.png").write_bytes(image_bytes("png", (64, 48), seed=3))
    # `@chart.png`: Claude Code opens the file with its Read tool before the turn ("Called the Read
    # tool with ...") and puts the picture in the user turn as an `image` block (base64,
    # image/png); the random model answers it. Gemma 3's chat template renders no tools (the
    # gateway refuses tools it would drop), and the tiny VLM's context is 8k: the turn offers the
    # model no tools (`--tools ""`: Claude Code still reads the file), a short system prompt, and
    # an output limit that fits beside the prompt (Claude Code's own 32k would not). The agent
    # variant's replies end after ~35 tokens on average (tests/unit/deploy/test_tiny_vlm.py), so a
    # reply reaching 2000 is out of the question.
    run = claude(
        gateway, tmp_path, "-p", "What is in @chart.png?", "--model", "tiny", "--output-format", "json",
        "--tools", "", "--system-prompt", "You describe pictures.",
        env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2000"},
    )  # fmt: skip
    access = [line for line in gateway.log_text().splitlines() if "gateway.access" in line]
    if engine == "llmapi":
        # The llmapi model renders its template itself around one user question and its images;
        # Claude Code's turn (a system prompt, a reminder turn, then the picture) is not one, so the
        # gateway refuses it with a 400 instead of dropping part of it.
        result = json.loads(run.stdout)
        assert run.returncode != 0 and result["is_error"] is True, result
        assert "API Error: 400" in result["result"], result
        assert all(" 400 " in line for line in access if "/v1/messages" in line), access
        return
    assert run.returncode == 0, run.stdout + run.stderr + gateway.log_text()
    result = json.loads(run.stdout)
    assert result["type"] == "result" and result["subtype"] == "success" and result["is_error"] is False, (
        result
    )
    # The model ended its turn itself, and every request of the turn was answered.
    assert result["stop_reason"] == "end_turn", result
    assert any("POST /v1/messages 200" in line for line in access), access
    assert not any("/v1/messages" in line and " 200 " not in line for line in access), access
