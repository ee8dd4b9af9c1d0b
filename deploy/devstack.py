"""Run the real tritonserver bundled in the nvidia-pytriton wheel on rendered CPU model repositories.

``TritonServer`` starts it (free ports, log file, readiness poll, clean shutdown of the whole process
group); ``prepare_dev_repository`` builds the tiny model when needed and renders the CPU repository;
``python -m deploy.devstack`` does both and serves until Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from deploy import native_engine
from deploy.model_repo import (
    LLMAPI_PROFILES,
    LlmapiSettings,
    ModelRepoError,
    parse_assignments,
    render_llmapi_repository,
    render_repository,
)
from deploy.multimodal_repo import render_cpu_multimodal_repository
from deploy.tiny_model import ALL_KINDS, DEV_KIND, build_tiny_model, default_cache_root
from deploy.tiny_vlm import is_vision_language_model

logger = logging.getLogger(__name__)

_POLL_S: Final = 0.2
DEV_TOKENS_PER_BLOCK: Final = 8
_LOG_TAIL_LINES: Final = 40


# Triton's HTTP frontend hands every generate_stream response to the connection's thread through a
# non-blocking socketpair (libevhtp's evthr_defer) and ignores a failed write: when that thread falls
# behind by more than the socket's send buffer holds, responses are lost (a stream's start, a token,
# its end). The buffer is net.core.wmem_default when Triton creates the socket: 212992 bytes hold 278
# commands; 32 MiB hold about 43k. `python -m loadtest.triton_http_drops` measures it.
WMEM_DEFAULT: Final = Path("/proc/sys/net/core/wmem_default")
TRITON_HTTP_SEND_BUFFER: Final = 32 * 2**20


class _SendBuffers:
    """net.core.wmem_default raised while tritonservers create their sockets, restored after the last
    one is up (the setting is read at socket creation, and it is the whole host's)."""

    def __init__(self, path: Path = WMEM_DEFAULT) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._holders = 0
        self._original: str | None = None

    def raise_to(self, size: int) -> tuple[bool, bool]:
        """(in force, held): whether the value now in force is at least `size`, and whether the
        caller holds it raised (and must `release`)."""
        with self._lock:
            try:
                current = int(self._path.read_text().strip())
            except (OSError, ValueError):
                return False, False
            if current >= size:
                if not self._holders:
                    return True, False  # the host's own setting: nothing to restore
                self._holders += 1
                return True, True
            try:
                self._path.write_text(str(size))
            except OSError:
                return False, False  # not root, or /proc/sys read-only (a container)
            if not self._holders:
                self._original = str(current)
            self._holders += 1
            return True, True

    def release(self) -> None:
        with self._lock:
            if not self._holders:
                return
            self._holders -= 1
            if not self._holders and self._original is not None:
                with contextlib.suppress(OSError):
                    self._path.write_text(self._original)
                self._original = None


_SEND_BUFFERS = _SendBuffers()


class TritonStartError(RuntimeError):
    """tritonserver exited or did not become ready; the message includes the end of its log."""


@dataclass(frozen=True, slots=True)
class TritonInstallation:
    """Where the pieces of the wheel's CPU tritonserver live."""

    binary: Path
    backends_dir: Path
    stub: Path
    libs_dir: Path


def find_triton() -> TritonInstallation:
    """Locate tritonserver, its backends, the Python-backend stub for this interpreter and its libraries."""
    import pytriton

    root = Path(pytriton.__file__).resolve().parent
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    installation = TritonInstallation(
        binary=root / "tritonserver" / "bin" / "tritonserver",
        backends_dir=root / "tritonserver" / "backends",
        stub=root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub",
        libs_dir=root.parent / "nvidia_pytriton.libs",
    )
    for path in (installation.binary, installation.backends_dir, installation.stub, installation.libs_dir):
        if not path.exists():
            raise TritonStartError(f"nvidia-pytriton installation incomplete: {path} is missing")
    return installation


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def _distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def server_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment tritonserver and its Python stubs need to run on this interpreter's packages.

    The stub embeds CPython and ignores PYTHONPATH; it finds its prefix like a ``python3`` on PATH
    would. With this interpreter's bin directory first on PATH, a venv's ``python3`` is found next to
    its ``pyvenv.cfg``, so the stub gets the venv's site-packages (torch, transformers, ...). Its
    libpython must be this interpreter's (LIBDIR first), or C extensions fail with undefined symbols.
    """
    env = dict(os.environ if base is None else base)
    installation = find_triton()
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != bin_dir)]
    )
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ld_path = [libdir, str(installation.libs_dir), *env.get("LD_LIBRARY_PATH", "").split(os.pathsep)]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in ld_path if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


# Run by the python3 the stub will embed, in the stub's environment: what it will import.
_STUB_PROBE = (
    "import sys, sysconfig\n"
    "v = '%d.%d' % sys.version_info[:2]\n"
    "import os\n"
    "name = sysconfig.get_config_var('INSTSONAME') or ''\n"
    "lib = os.path.join(sysconfig.get_config_var('LIBDIR') or '', name)\n"
    "shared = bool(name.startswith('libpython') and '.so' in name and os.path.exists(lib))\n"
    "try:\n"
    "    import numpy; n = numpy.__version__\n"
    "except Exception as e:\n"
    "    n = 'missing: %s' % e\n"
    "print(v, shared, lib, n, sep='|')\n"
)


_STUB_CHECKED: set[tuple[str, ...]] = set()


def check_stub_environment(env: Mapping[str, str] | None = None, *, python: str | None = None) -> None:
    """Refuse, in one line, an environment the Python backend stub cannot run in.

    The stub embeds the Python that ``python3`` on the server's PATH belongs to (its venv's
    site-packages included), built for this interpreter's version, linked to its libpython. It
    breaks without an error Triton reports on: under numpy 2 the models answer with 0 tokens and
    the preprocessing stub crashes; without numpy ``triton_python_backend_utils`` cannot load; a
    python3 of another version or without a shared libpython cannot be embedded by this stub.
    """
    env = server_environment(env)
    python = python or shutil.which("python3", path=env.get("PATH"))
    if python is None:
        raise TritonStartError("the Python backend stub needs a python3 on PATH; none found")
    key = (python, *(env.get(k, "") for k in ("PATH", "PYTHONPATH", "PYTHONHOME", "LD_LIBRARY_PATH")))
    if key in _STUB_CHECKED:
        return
    try:
        probe = subprocess.run(
            [python, "-c", _STUB_PROBE], capture_output=True, text=True, env=env, timeout=60, check=True
        )
        version, shared, soname, numpy_version = probe.stdout.strip().splitlines()[-1].split("|")
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        raise TritonStartError(
            f"cannot inspect the Python backend stub's python3 ({python}): {exc}"
        ) from None
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    if version != ours:
        raise TritonStartError(
            f"the Python backend stub is for Python {ours} but python3 on its PATH ({python}) is {version}"
        )
    if shared != "True" or not soname:
        raise TritonStartError(
            f"the Python backend stub needs {python}'s shared libpython ({soname or 'none'}), which is "
            "not installed (a python3 built with --enable-shared, or the distribution's libpython package)"
        )
    if numpy_version.startswith("missing"):
        raise TritonStartError(
            f"the Python backend stub needs numpy < 2 in {python}'s environment ({numpy_version})"
        )
    if int(numpy_version.split(".")[0]) >= 2:
        raise TritonStartError(
            f"numpy {numpy_version} in the Python backend stub's environment ({python}) breaks the stub "
            "(0-token answers, a crashed preprocessing stub): install numpy<2 there (the project pins 1.26.4)"
        )
    _STUB_CHECKED.add(key)


_LIVE_SERVERS: weakref.WeakSet[TritonServer] = weakref.WeakSet()


@atexit.register
def _stop_live_servers() -> None:
    for server in list(_LIVE_SERVERS):
        server.stop()


class TritonServer:
    """One tritonserver process serving ``repositories``; a context manager.

    Ports not given are chosen free; ``grpc_url`` is ``127.0.0.1:PORT`` (for tritonclient.grpc),
    ``http_url`` and ``metrics_url`` are full URLs. The server runs in its own process group, so
    ``stop`` also reaches the Python stubs it started, and leaves no orphans.
    """

    def __init__(
        self,
        repositories: Sequence[Path],
        *,
        grpc_port: int | None = None,
        http_port: int | None = None,
        metrics_port: int | None = None,
        work_dir: Path | None = None,
        log_file: Path | None = None,
        log_verbose: int = 0,
        exit_timeout_s: int = 5,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        http_send_buffer: int | None = None,
    ) -> None:
        """``http_send_buffer``: raise net.core.wmem_default to this many bytes while tritonserver
        starts (root only; see TRITON_HTTP_SEND_BUFFER), so that its HTTP frontend does not lose
        generate_stream responses under load; ``http_send_buffer_applied`` says whether it held."""
        if not repositories:
            raise ValueError("at least one model repository is required")
        # Every path is made absolute here, once: tritonserver runs with cwd=work_dir, so a path
        # relative to the caller (the backend directory under a relative work_dir) would name
        # another place for it.
        self.repositories = [Path(r).absolute() for r in repositories]
        self._requested_ports = (grpc_port, http_port, metrics_port)
        self._own_work_dir = work_dir is None
        self.work_dir = (
            Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="tritonserver-"))
        ).absolute()
        self.log_file = (
            Path(log_file) if log_file is not None else self.work_dir / "tritonserver.log"
        ).absolute()
        self._log_verbose = log_verbose
        self._exit_timeout_s = exit_timeout_s
        self._extra_args = list(extra_args)
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None
        self._http_send_buffer = http_send_buffer
        self.http_send_buffer_applied = False
        self._holds_send_buffers = False
        self._lock = threading.Lock()
        self.grpc_port = self.http_port = self.metrics_port = 0

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _backend_directory(self) -> Path:
        installation = find_triton()
        backends = self.work_dir / "backends"
        if not backends.exists():
            shutil.copytree(installation.backends_dir, backends, ignore=shutil.ignore_patterns("__pycache__"))
            stub = backends / "python" / "triton_python_backend_stub"
            shutil.copy2(installation.stub, stub)
            stub.chmod(0o755)
        if native_engine.serves_native(self.repositories):
            try:
                native_engine.install_backend(backends)
            except native_engine.NativeEngineError as exc:
                raise TritonStartError(str(exc)) from None
        return backends

    def start(self) -> None:
        """Launch tritonserver (returns at once; call ``wait_ready``)."""
        with self._lock:
            if self._process is not None:
                raise RuntimeError("this TritonServer was already started")
            explicit = [p for p in self._requested_ports if p is not None]
            busy = [p for p in explicit if not _port_is_free(p)]
            if busy:
                raise TritonStartError(f"port(s) {busy} already in use")
            check_stub_environment(self._env)
            chosen = iter(_distinct_free_ports(3))
            self.grpc_port, self.http_port, self.metrics_port = (
                p if p is not None else next(chosen) for p in self._requested_ports
            )
            binary = find_triton().binary
            command = [str(binary)]
            for repository in self.repositories:
                command.append(f"--model-repository={repository}")
            command += [
                f"--backend-directory={self._backend_directory()}",
                f"--grpc-port={self.grpc_port}",
                f"--http-port={self.http_port}",
                f"--metrics-port={self.metrics_port}",
                "--http-address=127.0.0.1",
                "--grpc-address=127.0.0.1",
                "--metrics-address=127.0.0.1",
                "--allow-gpu-metrics=false",
                # Our configs are complete; auto-complete would start (and import) every Python model twice.
                "--disable-auto-complete-config",
                f"--exit-timeout-secs={self._exit_timeout_s}",
                f"--log-verbose={self._log_verbose}",
                *self._extra_args,
            ]
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            if self._http_send_buffer:
                in_force, held = _SEND_BUFFERS.raise_to(self._http_send_buffer)
                self.http_send_buffer_applied, self._holds_send_buffers = in_force, held
                if held:
                    logger.info(
                        "net.core.wmem_default at %d while tritonserver starts (restored once it is up)",
                        self._http_send_buffer,
                    )
                if not self.http_send_buffer_applied:
                    logger.warning(
                        "could not raise net.core.wmem_default to %d (needs root): Triton's HTTP "
                        "frontend may lose generate_stream responses under load",
                        self._http_send_buffer,
                    )
            with open(self.log_file, "ab") as log:
                self._process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=server_environment(self._env),
                    cwd=self.work_dir,
                    start_new_session=True,
                )
            _LIVE_SERVERS.add(self)
            logger.info(
                "started tritonserver pid %s (grpc %s, http %s, metrics %s), log %s",
                self._process.pid,
                self.grpc_port,
                self.http_port,
                self.metrics_port,
                self.log_file,
            )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"{self.http_url}{path}", timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout: float = 180.0, *, abort: threading.Event | None = None) -> None:
        """Poll /v2/health/ready until every model is loaded.

        Raises TritonStartError if the server exits, ``timeout`` passes or ``abort`` is set.
        """
        try:
            self._wait_ready(timeout, abort)
        finally:
            # Ready (or gone): its HTTP threads and their sockets exist; the host's default goes back.
            self._release_send_buffers()

    def _release_send_buffers(self) -> None:
        if self._holds_send_buffers:
            self._holds_send_buffers = False
            _SEND_BUFFERS.release()

    def _wait_ready(self, timeout: float, abort: threading.Event | None) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._process is None:
                raise RuntimeError("start() the server first")
            if abort is not None and abort.is_set():
                raise TritonStartError("interrupted while waiting for tritonserver to become ready")
            if self._process.poll() is not None:
                raise TritonStartError(
                    f"tritonserver exited with code {self._process.returncode}; last log lines "
                    f"({self.log_file}):\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                status, _ = self._get("/v2/health/ready", timeout=1.0)
                # Readiness of someone else's server on a reused port would not prove anything.
                if status == 200 and self._process.poll() is None:
                    return
            if time.monotonic() > deadline:
                raise TritonStartError(
                    f"tritonserver not ready after {timeout:.0f}s; last log lines ({self.log_file}):\n"
                    f"{self.log_tail()}"
                )
            time.sleep(_POLL_S)

    def repository_index(self) -> list[dict[str, str]]:
        """Triton's model repository index: name, version and state of every model."""
        request = urllib.request.Request(f"{self.http_url}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=5.0) as response:
            return list(json.loads(response.read()))

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5.0) as response:
            return str(response.read().decode())

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (Triton unloads models and stops its stubs), SIGKILL the group after ``timeout``."""
        self._release_send_buffers()
        with self._lock:
            process = self._process
            if process is None:
                return
            # A server that exited on its own failed: keep its work directory (and log) for a post-mortem.
            crashed = process.poll() is not None
            if not crashed:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    logger.warning(
                        "tritonserver pid %s did not stop in %.0fs; killing it", process.pid, timeout
                    )
            # Stubs (same process group) that outlived the server, or everything after the timeout.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5.0)
            self._process = None
            _LIVE_SERVERS.discard(self)
            if crashed:
                logger.warning(
                    "tritonserver had exited with code %s; its log: %s", process.returncode, self.log_file
                )
            elif self._own_work_dir:
                # A clean stop leaves nothing behind (pass log_file to keep a log elsewhere).
                shutil.rmtree(self.work_dir, ignore_errors=True)
            else:
                shutil.rmtree(self.work_dir / "backends", ignore_errors=True)

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


ENGINE_MODES: Final = ("model", "synthetic", "native")


@dataclass(frozen=True, slots=True)
class DevRepository:
    """A rendered CPU repository and what it serves: ``ensemble`` is the model a gateway's
    ``triton_model`` names (with engine mode ``native``, the engine model itself: no ensemble)."""

    path: Path
    model_dir: Path
    variant: str
    engine_mode: str
    ensemble: str


def prepare_dev_repository(
    out_dir: Path,
    *,
    model_dir: Path | None = None,
    variant: str = "current",
    engine_mode: str = "model",
    tokenizer_kind: str = DEV_KIND,
    variables: Mapping[str, object] | None = None,
    cache_root: Path | None = None,
) -> DevRepository:
    """Render the CPU repository into ``out_dir`` (replacing it), building the tiny model if needed.

    ``engine_mode`` ``model`` and ``synthetic`` render the four models on the CPU reference engine;
    ``native`` renders the engine model alone on the native engine (a synthetic token clock in C).
    """
    if engine_mode not in ENGINE_MODES:
        raise ModelRepoError(f"engine_mode must be one of {', '.join(ENGINE_MODES)}, got {engine_mode!r}")
    if model_dir is None:
        model_dir = build_tiny_model(tokenizer_kind, cache_root=cache_root)
    prefix = str((variables or {}).get("name_prefix", ""))
    if engine_mode == "native":
        native: dict[str, object] = {"tokenizer_dir": str(model_dir), **(variables or {})}
        path = render_repository(out_dir, backend="native", variant=variant, variables=native, overwrite=True)
        return DevRepository(path, Path(model_dir), variant, engine_mode, f"{prefix}tensorrt_llm")
    values: dict[str, object] = {
        "tokenizer_dir": str(model_dir),
        "model_dir": str(model_dir),
        "engine_mode": engine_mode,
        # As production configurations serve: a repeated prefix reuses its KV cache blocks. Small
        # blocks, so that the tiny model's short prompts show it.
        "enable_kv_cache_reuse": True,
        "tokens_per_block": DEV_TOKENS_PER_BLOCK,
    }
    values.update(variables or {})
    if engine_mode == "model" and is_vision_language_model(Path(model_dir)):
        # A vision-language checkpoint is served as TensorRT-LLM's multimodal repository is.
        path = render_cpu_multimodal_repository(out_dir, values)
        return DevRepository(path, Path(model_dir), "multimodal", engine_mode, f"{prefix}ensemble")
    path = render_repository(out_dir, backend="cpu", variant=variant, variables=values, overwrite=True)
    return DevRepository(path, Path(model_dir), variant, engine_mode, f"{prefix}ensemble")


def prepare_llmapi_repository(
    out_dir: Path,
    *,
    model_dir: Path | None = None,
    profile: str = "current",
    decoupled: bool = True,
    tokenizer_kind: str = DEV_KIND,
    cache_root: Path | None = None,
) -> DevRepository:
    """Render the CPU stand-in of TensorRT-LLM's llmapi model into ``out_dir`` (replacing it), under
    upstream's model name ``tensorrt_llm``."""
    if model_dir is None:
        model_dir = build_tiny_model(tokenizer_kind, cache_root=cache_root)
    settings = LlmapiSettings(
        model=str(model_dir),
        profile=profile,
        decoupled=decoupled,
        stand_in=True,
        # Small blocks, so that the tiny model's short prompts show their reuse (cached_tokens).
        tokens_per_block=DEV_TOKENS_PER_BLOCK,
        # A vision-language checkpoint is served with images in, as model.yaml turns them on.
        multimodal=is_vision_language_model(Path(model_dir)),
    )
    path = render_llmapi_repository(out_dir, settings, overwrite=True)
    return DevRepository(path, Path(model_dir), f"llmapi {profile}", "llmapi", settings.name)


def engine_variables(device: str | None, dtype: str | None) -> dict[str, object]:
    """The template variables of the reference engine's device and dtype (only those given)."""
    values: dict[str, object] = {}
    if device is not None:
        values["engine_device"] = device
    if dtype is not None:
        values["engine_dtype"] = dtype
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.devstack", description=__doc__)
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="HF model dir (default: build the tiny model)"
    )
    parser.add_argument("--tokenizer-kind", choices=ALL_KINDS, default=DEV_KIND, help="tiny model kind")
    parser.add_argument("--variant", choices=("current", "legacy"), default="current")
    parser.add_argument(
        "--engine-mode",
        choices=ENGINE_MODES,
        default="model",
        help="model: the CPU reference engine with the tiny model; synthetic: its synthetic tokens; native: "
        "the native engine alone (engines/native/, a synthetic token clock in C, no ensemble)",
    )
    parser.add_argument(
        "--engine-device",
        choices=("cpu", "cuda"),
        default=None,
        help="where the reference engine's torch runs the model (engine_device; default cpu); with cuda "
        "use --tokenizer-kind gpu for a model of a few hundred M parameters",
    )
    parser.add_argument(
        "--engine-dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default=None,
        help="the model's dtype (engine_dtype; auto: float32 on cpu, bfloat16 on cuda)",
    )
    parser.add_argument(
        "--engine",
        choices=("cpp", "llmapi"),
        default="cpp",
        help="cpp: the C++ repository (ensemble and tensorrt_llm model) on the CPU reference engine; "
        "llmapi: a CPU stand-in of TensorRT-LLM's llmapi Python model",
    )
    parser.add_argument(
        "--llmapi-profile",
        choices=LLMAPI_PROFILES,
        default="current",
        help="with --engine llmapi: which model.py it behaves as (current: streams per step; v1.2: "
        "TensorRT-LLM 1.2.x, one response per stream)",
    )
    parser.add_argument(
        "--llmapi-decoupled",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --engine llmapi: whether the model is decoupled (streams)",
    )
    parser.add_argument("--grpc-port", type=int, default=None)
    parser.add_argument("--http-port", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="repository, backends and log (default: temp)"
    )
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    own_work_dir = args.work_dir is None
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="devstack-", dir=_devstack_root()))
    try:
        if args.engine == "llmapi":
            repo = prepare_llmapi_repository(
                work_dir / "model_repository",
                model_dir=args.model_dir,
                profile=args.llmapi_profile,
                decoupled=args.llmapi_decoupled,
                tokenizer_kind=args.tokenizer_kind,
            )
        else:
            repo = prepare_dev_repository(
                work_dir / "model_repository",
                model_dir=args.model_dir,
                variant=args.variant,
                engine_mode=args.engine_mode,
                tokenizer_kind=args.tokenizer_kind,
                variables={
                    **engine_variables(args.engine_device, args.engine_dtype),
                    **parse_assignments(args.assignments),
                },
            )
    except ModelRepoError as exc:
        logger.error("%s", exc)
        if own_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        # A handler runs on the main thread, which may be inside stop.wait() holding the event's
        # lock: setting the event right here can deadlock, so another thread sets it.
        threading.Thread(target=stop.set, daemon=True).start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    server = TritonServer(
        [repo.path],
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        work_dir=work_dir,
        http_send_buffer=TRITON_HTTP_SEND_BUFFER,
    )
    clean = False
    try:
        server.start()
        server.wait_ready(args.ready_timeout, abort=stop)
        models = ",".join(sorted(m["name"] for m in server.repository_index()))
        sys.stdout.write(
            f"READY grpc={server.grpc_url} http={server.http_url} metrics={server.metrics_url} "
            f"ensemble={repo.ensemble} models={models} log={server.log_file}\n"
        )
        sys.stdout.flush()
        while not stop.wait(1.0):
            if not server.is_running():
                logger.error("tritonserver exited unexpectedly; last log lines:\n%s", server.log_tail())
                return 1
        clean = True
    except TritonStartError as exc:
        if not stop.is_set():
            logger.error("%s", exc)
            return 1
        clean = True
    finally:
        server.stop()
        if clean and own_work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
        elif not clean:
            logger.error("kept %s for inspection", work_dir)
    return 0


def _devstack_root() -> Path:
    root = default_cache_root() / "devstack"
    root.mkdir(parents=True, exist_ok=True)
    return root


if __name__ == "__main__":
    raise SystemExit(main())
