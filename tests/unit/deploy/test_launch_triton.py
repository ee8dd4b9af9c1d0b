"""deploy/launch_triton.sh: the tritonserver / mpirun command lines, readiness, and a clean stop.

The command lines are checked with --dry-run. The lifecycle runs for real against fakes: a fake
`tritonserver` (answers /v2/health/ready on rank 0's port), a fake `mpirun` (starts every `:`-separated
rank, forwards SIGTERM) and a fake `nvidia-smi`.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "deploy" / "launch_triton.sh"
TRITONSERVER = "/opt/tritonserver/bin/tritonserver"


def dry_run(*args: str) -> list[str]:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "not checking the repository, tritonserver, mpirun or GPUs" in result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("+ ")]
    return shlex.split(line[2:])


RANK0_FLAGS = [
    "--model-repository=/models/repo",
    "--http-port=8000",
    "--grpc-port=8001",
    "--metrics-port=8002",
    "--disable-auto-complete-config",
    "--backend-config=python,shm-region-prefix-name=prefix0_",
    "--exit-timeout-secs=30",
]


def worker_flags(rank: int) -> list[str]:
    return [
        "--model-repository=/models/repo",
        "--allow-http=false",
        "--allow-grpc=false",
        "--allow-metrics=false",
        "--model-control-mode=explicit",
        "--load-model=tensorrt_llm",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
        "--exit-timeout-secs=30",
    ]


def test_one_gpu_runs_tritonserver_directly() -> None:
    assert dry_run("--model-repo", "/models/repo", "--world-size", "1") == [TRITONSERVER, *RANK0_FLAGS]


def test_tp4_runs_one_rank_per_gpu_under_mpirun_with_rank0_serving() -> None:
    argv = dry_run("--model-repo", "/models/repo", "--world-size", "4")
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    ranks: list[list[str]] = [[]]
    for arg in argv[2:]:
        if arg == ":":
            ranks.append([])
        else:
            ranks[-1].append(arg)
    assert ranks[0] == ["-n", "1", TRITONSERVER, *RANK0_FLAGS]
    for rank in (1, 2, 3):
        assert ranks[rank] == ["-n", "1", TRITONSERVER, *worker_flags(rank)]
    assert len(ranks) == 4


def test_ports_mpi_args_model_names_and_extra_arguments_are_passed_through() -> None:
    argv = dry_run(
        "--model-repo", "/m", "--world-size", "2", "--http-port", "9800", "--grpc-port", "9801",
        "--metrics-port", "9802", "--mpi-arg", "--oversubscribe", "--trtllm-model", "tensorrt_llm,draft",
        "--exit-timeout", "5", "--", "--log-verbose=1",
    )  # fmt: skip
    assert argv[:3] == ["mpirun", "--allow-run-as-root", "--oversubscribe"]
    rank0 = argv[3 : argv.index(":")]
    rank1 = argv[argv.index(":") + 1 :]
    assert "--http-port=9800" in rank0 and "--grpc-port=9801" in rank0 and "--metrics-port=9802" in rank0
    assert not any(a.startswith(("--http-port", "--grpc-port", "--metrics-port")) for a in rank1)
    assert [a for a in rank1 if a.startswith("--load-model=")] == [
        "--load-model=tensorrt_llm",
        "--load-model=draft",
    ]
    assert rank0[-2:] == ["--exit-timeout-secs=5", "--log-verbose=1"]
    assert rank1[-2:] == ["--exit-timeout-secs=5", "--log-verbose=1"]


def test_dry_run_needs_an_explicit_world_size() -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--model-repo", "/m"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert "--dry-run needs an explicit --world-size" in result.stderr


# --- real runs against fakes -------------------------------------------------------------------------------

FAKE_TRITONSERVER = """\
#!{python}
import http.server, os, signal, sys, threading, time
args = sys.argv[1:]
pid_dir = os.environ["FAKE_PID_DIR"]
with open(os.path.join(pid_dir, str(os.getpid())), "w") as f:
    f.write(" ".join(args))
if os.environ.get("FAKE_WMEM_SEEN"):  # what net.core.wmem_default was when the server started
    with open(os.environ["WMEM_DEFAULT_FILE"]) as src, open(os.environ["FAKE_WMEM_SEEN"], "w") as dst:
        dst.write(src.read().strip())
if os.environ.get("FAKE_EXIT_CODE"):
    sys.exit(int(os.environ["FAKE_EXIT_CODE"]))
if os.environ.get("FAKE_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
if "--allow-http=false" in args:
    while True:
        time.sleep(1)
port = int(next(a for a in args if a.startswith("--http-port=")).split("=", 1)[1])
ready_at = time.monotonic() + float(os.environ.get("FAKE_READY_AFTER", "0.3"))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/v2/health/ready" and time.monotonic() >= ready_at
        self.send_response(200 if ok else 400)
        self.end_headers()
    def log_message(self, *a):
        pass

server = http.server.HTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
while True:
    time.sleep(1)
"""

# Like Open MPI's mpirun here: start each `-n 1 CMD ...` segment, forward SIGTERM, exit when all have.
FAKE_MPIRUN = """\
#!{python}
import signal, subprocess, sys
argv = sys.argv[1:]
while argv and argv[0] != "-n":
    argv.pop(0)
segments, current = [], []
for arg in argv + [":"]:
    if arg == ":":
        segments.append(current[2:])
        current = []
    else:
        current.append(arg)
# Open MPI starts each rank in a session of its own: a signal to mpirun's group does not reach them.
procs = [subprocess.Popen(cmd, start_new_session=True) for cmd in segments]
signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""

FAKE_NVIDIA_SMI = """\
#!/bin/sh
i=0
while [ "$i" -lt "${FAKE_GPUS:-1}" ]; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; i=$((i + 1)); done
"""


def write_tool(path: Path, body: str) -> Path:
    path.write_text(body.replace("{python}", os.path.realpath(sys.executable)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for tool in ("bash", "grep", "sleep", "env"):
            found = shutil.which(tool)
            assert found, tool
            (self.bin / tool).symlink_to(found)
        (self.bin / "python3").symlink_to(os.path.realpath(sys.executable))
        write_tool(self.bin / "nvidia-smi", FAKE_NVIDIA_SMI)
        write_tool(self.bin / "mpirun", FAKE_MPIRUN)
        self.tritonserver = write_tool(tmp / "tritonserver", FAKE_TRITONSERVER)
        self.pids = tmp / "pids"
        self.pids.mkdir()
        self.repo = tmp / "repo"
        (self.repo / "tensorrt_llm").mkdir(parents=True)
        self.engine = tmp / "engine"
        self.engine.mkdir()
        self.set_engine_world_size(1)
        self.port = free_port()
        # The host's sysctl stays untouched: the script raises and restores this file instead.
        self.wmem = tmp / "wmem_default"
        self.wmem.write_text("212992\n")
        self.proc: subprocess.Popen[str] | None = None

    def set_engine_world_size(self, world: int) -> None:
        # The shape of the tensorrt_llm config the renderer writes: gpt_model_path names the engine.
        (self.repo / "tensorrt_llm" / "config.pbtxt").write_text(
            'backend: "tensorrtllm"\nparameters: {\n  key: "gpt_model_path"\n'
            f'  value: {{ string_value: "{self.engine}" }}\n}}\n'
        )
        mapping = {"world_size": world, "tp_size": world, "pp_size": 1}
        (self.engine / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": mapping}}))

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        self.proc = subprocess.Popen(
            ["bash", str(SCRIPT), "--model-repo", str(self.repo), "--tritonserver", str(self.tritonserver),
             "--http-port", str(self.port), *args],
            env={"PATH": str(self.bin), "FAKE_PID_DIR": str(self.pids), "READY_POLL_INTERVAL": "0.1",
                 "WMEM_DEFAULT_FILE": str(self.wmem), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_interrupt,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stderr, self._lines), daemon=True).start()
        return self.proc

    def wait_for_line(self, needle: str, timeout: float = 20.0) -> str:
        assert self.proc is not None and self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            # Bounded wait for the next line: a script that stops writing fails the test, never hangs it.
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:  # the script closed stderr: it has ended
                break
            seen.append(line)
            if needle in line:
                return line
        raise AssertionError(f"{needle!r} not seen; stderr so far: {''.join(seen)}")

    def server_pids(self) -> list[int]:
        return [int(p.name) for p in self.pids.iterdir()]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.server_pids():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _default_interrupt() -> None:
    # A shell cannot trap a signal that was ignored when it started, and a test run started in the
    # background of a non-interactive shell inherits SIGINT and SIGQUIT ignored: the script under
    # test must get them as a terminal would give them.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_waits_for_readiness_then_sigterm_stops_every_rank(stack: Stack) -> None:
    stack.set_engine_world_size(2)
    proc = stack.start(FAKE_GPUS="2")
    line = stack.wait_for_line("ready after")
    assert f"http :{stack.port}" in line and "(2 rank(s))" in line
    pids = stack.server_pids()
    assert len(pids) == 2
    ranks = sorted(Path(stack.pids, str(p)).read_text() for p in pids)
    assert sum("--allow-http=false" in r for r in ranks) == 1

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 143
    assert wait_gone(pids) == []


def test_a_server_ignoring_sigterm_is_killed_after_the_stop_timeout(stack: Stack) -> None:
    proc = stack.start("--stop-timeout", "1", FAKE_IGNORE_TERM="1")
    stack.wait_for_line("ready after")
    pids = stack.server_pids()
    proc.send_signal(signal.SIGINT)
    stack.wait_for_line("still running after 1s: SIGKILL")
    assert proc.wait(timeout=15) == 130
    assert wait_gone(pids) == []


def test_ranks_ignoring_sigterm_are_killed_even_in_their_own_process_groups(stack: Stack) -> None:
    stack.set_engine_world_size(2)
    proc = stack.start("--stop-timeout", "1", FAKE_GPUS="2", FAKE_IGNORE_TERM="1")
    stack.wait_for_line("ready after")
    pids = stack.server_pids()
    assert len(pids) == 2
    proc.send_signal(signal.SIGTERM)
    stack.wait_for_line("still running after 1s: SIGKILL")
    assert proc.wait(timeout=15) == 143
    assert wait_gone(pids) == []


def test_the_send_buffer_is_raised_while_triton_starts_and_put_back_once_ready(stack: Stack) -> None:
    seen = stack.pids.parent / "wmem_seen"
    proc = stack.start(FAKE_WMEM_SEEN=str(seen))
    stack.wait_for_line("raised net.core.wmem_default from 212992 to 33554432 while tritonserver starts")
    stack.wait_for_line("ready after")
    stack.wait_for_line("net.core.wmem_default back to 212992")
    assert seen.read_text() == "33554432"  # what Triton's sockets got
    assert stack.wmem.read_text().strip() == "212992"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 143


def test_a_launch_that_fails_before_ready_puts_the_send_buffer_back_too(stack: Stack) -> None:
    proc = stack.start("--http-send-buffer", "1048576", FAKE_EXIT_CODE="7")
    stack.wait_for_line("raised net.core.wmem_default from 212992 to 1048576")
    assert proc.wait(timeout=15) == 1
    assert stack.wmem.read_text().strip() == "212992"


@pytest.mark.parametrize(
    ("value", "args", "needle"),
    [("67108864", (), None), ("212992", ("--http-send-buffer", "0"), None), (None, (), "cannot read")],
    ids=["already-higher", "off", "unreadable"],
)
def test_the_send_buffer_is_left_alone_when_high_enough_off_or_unreadable(
    stack: Stack, value: str | None, args: tuple[str, ...], needle: str | None
) -> None:
    if value is None:
        stack.wmem.unlink()
    else:
        stack.wmem.write_text(value)
    proc = stack.start(*args)
    if needle:
        stack.wait_for_line(needle)
    line = stack.wait_for_line("ready after")
    assert "raised" not in line
    assert (stack.wmem.read_text() if value is not None else None) == value
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 143


def test_a_server_that_dies_before_ready_fails_the_launch(stack: Stack) -> None:
    proc = stack.start(FAKE_EXIT_CODE="7")
    stack.wait_for_line("tritonserver exited with status 7 before it was ready")
    assert proc.wait(timeout=15) == 1


def test_a_server_never_ready_is_stopped_after_the_ready_timeout(stack: Stack) -> None:
    proc = stack.start("--ready-timeout", "1", FAKE_READY_AFTER="3600")
    stack.wait_for_line("not ready after 1s: stopping")
    assert proc.wait(timeout=15) == 1
    assert wait_gone(stack.server_pids()) == []


def test_the_engine_needs_as_many_gpus_as_its_world_size(stack: Stack) -> None:
    stack.set_engine_world_size(4)
    proc = stack.start(FAKE_GPUS="2")
    stack.wait_for_line("the engine needs 4 GPU(s), nvidia-smi lists 2")
    assert proc.wait(timeout=15) == 1
    assert stack.server_pids() == []


def test_an_unrendered_repository_is_a_clear_error(stack: Stack) -> None:
    (stack.repo / "tensorrt_llm" / "config.pbtxt").unlink()
    proc = stack.start()
    stack.wait_for_line("tensorrt_llm/config.pbtxt not found: render the repository first")
    assert proc.wait(timeout=15) == 1


# --- the real tritonserver (the CPU build bundled in nvidia-pytriton) ---------------------------------------


def our_processes(marker: str) -> list[str]:
    """Command lines of live processes mentioning `marker` (a path unique to one test)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in args)
        if marker in text and alive(int(cmdline.parent.name)):
            found.append(text)
    return found


@pytest.mark.integration
@pytest.mark.parametrize("world", [1, 2], ids=["1-rank", "2-ranks-mpirun"])
def test_real_tritonserver_serves_the_repository_and_stops_cleanly(
    tmp_path: Path, tiny_bpe_dir: Path, world: int
) -> None:
    if world > 1 and shutil.which("mpirun") is None:
        pytest.skip(
            "Open MPI's mpirun is not installed (Debian: openmpi-bin); the fake-mpirun tests above ran"
        )
    import urllib.request

    from deploy import devstack, model_repo

    # The CPU repository has the same four models; the synthetic engine makes loading quick.
    repo = model_repo.render_repository(
        tmp_path / "repo",
        backend="cpu",
        variant="current",
        variables={"tokenizer_dir": str(tiny_bpe_dir), "engine_mode": "synthetic"},
    )
    installation = devstack.find_triton()
    backends = tmp_path / "backends"
    shutil.copytree(installation.backends_dir, backends, ignore=shutil.ignore_patterns("__pycache__"))
    stub = backends / "python" / "triton_python_backend_stub"
    shutil.copy2(installation.stub, stub)
    stub.chmod(0o755)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    write_tool(fake_bin / "nvidia-smi", FAKE_NVIDIA_SMI)
    env = devstack.server_environment()
    env.update(PATH=f"{fake_bin}{os.pathsep}{env['PATH']}", FAKE_GPUS=str(world), READY_POLL_INTERVAL="0.2")
    # Not the host's sysctl: the test_launch_triton fakes check raising and restoring it.
    env["WMEM_DEFAULT_FILE"] = str(tmp_path / "wmem_default")
    (tmp_path / "wmem_default").write_text("212992\n")
    http, grpc_port, metrics = (devstack.free_port() for _ in range(3))
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--model-repo", str(repo), "--world-size", str(world),
         "--tritonserver", str(installation.binary), "--http-port", str(http), "--grpc-port", str(grpc_port),
         "--metrics-port", str(metrics), "--exit-timeout", "5", "--stop-timeout", "30",
         "--", f"--backend-directory={backends}", "--allow-gpu-metrics=false"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        output = []
        for line in proc.stdout:
            output.append(line)
            if "launch_triton: ready after" in line:
                break
        else:
            pytest.fail("launch_triton.sh ended before Triton was ready:\n" + "".join(output[-40:]))
        index = urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{http}/v2/repository/index", data=b"{}"), timeout=5
        )
        states = {m["name"]: m["state"] for m in json.loads(index.read())}
        assert states == dict.fromkeys(
            ("ensemble", "postprocessing", "preprocessing", "tensorrt_llm"), "READY"
        )
        servers = [p for p in our_processes(str(repo)) if p.startswith(str(installation.binary))]
        assert len(servers) == world
        assert (
            sum("--allow-http=false" in p and "--load-model=tensorrt_llm" in p for p in servers) == world - 1
        )

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        # Python backend stubs leave after the server: on a loaded 2-core machine that took over 10 s.
        deadline = time.monotonic() + 60
        while our_processes(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert our_processes(str(tmp_path)) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
