"""Every shell and Python example in README.md and docs/ runs, against a gateway serving `tiny` as
`make run` does, or is marked with what it needs (`<!-- requires: ... -->`, docs/contributing.md).

The gateway runs on the session's CPU Triton (its byte-level BPE tiny model, served under the dev
stack's name and defaults) on a free port, which replaces 127.0.0.1:9000 and localhost:9000 in each
example. With DOCS_GATEWAY_URL set (say http://127.0.0.1:9000, with `make run` serving), the
examples run against that gateway instead, and no Triton is started.

Shell examples run under `bash -e -o pipefail` with curl failing on an HTTP error status;
Python examples run in a fresh interpreter. An example that fails, or outlives its time, fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import TritonStack
from tests.support.docs_snippets import ROOT, SHELL, Block, all_blocks
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

RUNNABLE = [block for block in all_blocks() if block.runs]
# A guard against a hung example, not a speed bound: an example takes seconds, but on a machine
# loaded far beyond its cores a fresh interpreter importing an SDK took over 120 s.
EXAMPLE_TIMEOUT_S = 600
# curl as the examples mean it: quiet, and an HTTP error is a failed command, with its body shown.
CURL = 'curl() { command curl --silent --show-error --fail-with-body "$@"; echo; }\n'


class RunningGateway:
    """A gateway started elsewhere (DOCS_GATEWAY_URL)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")


@pytest.fixture(scope="module")
def docs_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess | RunningGateway]:
    url = os.environ.get("DOCS_GATEWAY_URL")
    if url:
        yield RunningGateway(url)
        return
    triton_stack: TritonStack = request.getfixturevalue("triton_stack")
    model = triton_stack.models["bpe_current"]
    # The dev stack's model options (gateway.devserver): what the examples are written against.
    spec = (
        f"name=tiny,tokenizer={model.tokenizer_dir},triton_model={model.ensemble},"
        # The bpe tiny model seldom ends by itself, where the dev stack's agent model ends its own
        # replies: a small backstop keeps examples that set no limit quick, and reports its cut as
        # a completed answer, as the agent model's own end would be (the Agents SDK example
        # raises on an incomplete response).
        "tool_parser=hermes,default_max_tokens=64,default_limit_status=completed"
    )
    state = tmp_path_factory.mktemp("docs_state")
    args = [
        "--triton-url",
        triton_stack.grpc_url,
        "--triton-http-url",
        triton_stack.http_url,
        "--model",
        spec,
        "--state-dir",
        str(state),
    ]
    gateway = GatewayProcess(args)
    # Generous: on a loaded machine the tokenizer load and Triton's first answers are slow.
    gateway.start(timeout=300)
    try:
        yield gateway
    finally:
        gateway.stop()


def _localize(text: str, gateway: GatewayProcess | RunningGateway) -> str:
    address = gateway.base_url.removeprefix("http://")
    return text.replace("127.0.0.1:9000", address).replace("localhost:9000", address)


def _run(
    block: Block, gateway: GatewayProcess | RunningGateway, tmp: Path
) -> subprocess.CompletedProcess[str]:
    code = _localize(block.text, gateway)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        # The SDKs would otherwise retry a failed request and hide it behind a slower failure.
        "OPENAI_MAX_RETRIES": "0",
    }
    if block.language in SHELL:
        argv = ["bash", "-e", "-o", "pipefail", "-c", CURL + code]
    else:
        argv = [sys.executable, "-c", code]
    return subprocess.run(
        argv, cwd=tmp, env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S, check=False
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.where)
def test_documented_example_runs(
    block: Block, docs_gateway: GatewayProcess | RunningGateway, tmp_path: Path
) -> None:
    result = _run(block, docs_gateway, tmp_path)
    assert result.returncode == 0, (
        f"{block.where}: the example failed (exit {result.returncode}); mark it "
        f"`<!-- requires: ... -->` if it cannot run against the dev stack.\n"
        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
    )


def test_an_example_that_fails_is_caught(
    docs_gateway: GatewayProcess | RunningGateway, tmp_path: Path
) -> None:
    """The harness itself: a request the gateway refuses fails the example, in shell and Python."""
    bad_curl = Block(
        path=ROOT / "README.md",
        line=0,
        language="bash",
        requires=None,
        text="curl http://127.0.0.1:9000/v1/chat/completions -H 'Content-Type: application/json' "
        '-d \'{"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}\'\n',
    )
    bad_python = Block(
        path=ROOT / "README.md",
        line=0,
        language="python",
        requires=None,
        text='from openai import OpenAI\nOpenAI(base_url="http://127.0.0.1:9000/v1", api_key="x")'
        '.models.retrieve("no-such-model")\n',
    )
    assert _run(bad_curl, docs_gateway, tmp_path).returncode != 0
    assert _run(bad_python, docs_gateway, tmp_path).returncode != 0
