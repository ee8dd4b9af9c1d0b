"""Pack what a GPU host without network needs to run the CPU Triton stack and `make bench-host`, and
unpack it there.

`pack` (here, in the project's venv): the tritonserver of the nvidia-pytriton wheel slimmed to what
it runs on (the binary, the Python backend, one Python version's stub, and only the bundled libraries
`ldd` resolves for them), the native engine backend built here (`engines/native/`, C, only libc: built
against this machine's glibc, which a newer host's runs), plus the gateway's dependencies that the
host lacks, installed from cp312 wheels for that Python (pip's --target install for another
platform, pinned to the versions installed here). Both are xz-packed; the whole stays under the
64 MiB a device call carries.

`install` (on the host): a venv of the host's python3 whose own site-packages come first (the bundled
packages, numpy < 2 among them: the Python backend stub crashes under numpy 2) and the host's site-packages
after them (torch, transformers, ...), with the slim tritonserver inside it, so `import pytriton`
finds it as deploy.devstack expects.

    python -m deploy.bundle_host pack --out .hostbundle
    python3 deploy/bundle_host.py install --bundle .hostbundle --venv /tmp/hostvenv
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

LIMIT_BYTES = 64 * 2**20
TRITON_ARCHIVE = "triton.tar.xz"
PACKAGES_ARCHIVE = "site-packages.tar.xz"
# The gateway's and the load generator's imports that a CUDA/PyTorch image usually lacks, with their
# own dependencies; versions are the ones installed here (what the tests ran with).
HOST_PACKAGES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httptools",
    "pydantic",
    "pydantic-core",
    "pydantic-settings",
    "python-dotenv",
    "typing-inspection",
    "annotated-types",
    "sse-starlette",
    "tritonclient",
    "python-rapidjson",
    "protobuf",
    "orjson",
    "numpy",
    "cryptography",
    "cffi",
    "pycparser",
    # tritonclient needs ml_dtypes <= 0.5.4 (the host's newer one wants numpy 2); FastAPI needs
    # opentelemetry-api (its telemetry hooks, off here).
    "ml-dtypes",
    "opentelemetry-api",
    # Imported at the gateway's start: the cut tool-call reader of /v1/messages, Triton's HTTP
    # generate_stream client (with its own dependencies) and the shared-state client.
    "jiter",
    "aiohttp",
    "aiohappyeyeballs",
    "aiosignal",
    "attrs",
    "frozenlist",
    "multidict",
    "propcache",
    "yarl",
    "idna",
    "redis",
)
# Host packages left out of the venv: they need numpy 2 at import, and the stub needs numpy < 2.
HOST_EXCLUDED = ("scipy", "sklearn", "scikit_learn")
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


class BundleError(RuntimeError):
    """What is wrong, in one line."""


def _site_root() -> tuple[Path, Path]:
    """(the pytriton package directory, the nvidia_pytriton.libs directory beside it)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise BundleError("nvidia-pytriton is not installed here (make install)")
    package = Path(spec.origin).resolve().parent
    return package, package.parent / "nvidia_pytriton.libs"


def resolved_libraries(binaries: Iterable[Path], libs_dir: Path) -> tuple[set[Path], set[str]]:
    """The libraries of libs_dir that `ldd` resolves for the binaries, and the names it cannot find
    here (the host must have them, libpython of another version for one)."""
    found: set[Path] = set()
    missing: set[str] = set()
    env = {**os.environ, "LD_LIBRARY_PATH": str(libs_dir)}
    for binary in binaries:
        out = subprocess.run(
            ["ldd", str(binary)], capture_output=True, text=True, env=env, check=False
        ).stdout
        for line in out.splitlines():
            m = re.match(r"\s*(\S+) => (not found|(\S+))", line)
            if not m:
                continue
            if m.group(2) == "not found":
                missing.add(m.group(1))
            elif Path(m.group(3)).resolve().parent == libs_dir.resolve():
                found.add(Path(m.group(3)).resolve())
    return found, missing


def pack_triton(out: Path, python: str) -> tuple[Path, set[str]]:
    from deploy import native_engine

    try:
        native = native_engine.build()
    except native_engine.NativeEngineError as exc:
        raise BundleError(str(exc)) from None
    package, libs_dir = _site_root()
    server = package / "tritonserver"
    stub = server / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not stub.exists():
        raise BundleError(f"no Python backend stub for Python {python} in {server}")
    members = {
        server / "bin" / "tritonserver",
        server / "backends" / "python" / "libtriton_python.so",
        server / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    }
    libs, missing = resolved_libraries(sorted(p for p in members if p.suffix != ".py"), libs_dir)
    archive = out / TRITON_ARCHIVE
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        # `import pytriton` needs only to find the package: devstack reads its tritonserver/ folder.
        init = tarfile.TarInfo("pytriton/__init__.py")
        body = b'"""The slim tritonserver of deploy/bundle_host.py (not the pytriton library)."""\n'
        init.size = len(body)
        tar.addfile(init, io.BytesIO(body))
        for path in sorted(members):
            tar.add(path, arcname=str(path.relative_to(package.parent)))
        for lib in sorted(libs):
            tar.add(lib, arcname=f"nvidia_pytriton.libs/{lib.name}")
        # Where devstack copies the wheel's backends from: served as backend "native_engine" there.
        backend = f"pytriton/tritonserver/backends/{native_engine.BACKEND_NAME}/{native_engine.LIBRARY_NAME}"
        tar.add(native, arcname=backend)
    return archive, missing


def packages_archive(out: Path, python: str, packages: Sequence[str]) -> tuple[Path, int]:
    """The packages installed for the host's Python (pip's cross-platform --target install), xz-packed:
    a third smaller than their wheels (numpy's libraries compress far better with xz)."""
    staging = out / "site-packages"
    shutil.rmtree(staging, ignore_errors=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in packages]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-deps",
        "--no-compile",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--target",
        str(staging),
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    result = subprocess.run([*cmd, *pins], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BundleError(f"pip install --target failed: {result.stderr.strip().splitlines()[-1:]}")
    archive = out / PACKAGES_ARCHIVE
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for path in sorted(staging.iterdir()):
            if path.name != "bin":  # console scripts with this machine's interpreter path
                tar.add(path, arcname=path.name)
    shutil.rmtree(staging)
    return archive, len(pins)


def pack(out: Path, python: str, packages: Sequence[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    archive, missing = pack_triton(out, python)
    packed, count = packages_archive(out, python, packages)
    shutil.copy2(__file__, out / "bundle_host.py")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB (not bundled, found on the host: "
        f"{', '.join(sorted(missing)) or 'none'})"
    )
    print(f"{packed}: {count} packages, {packed.stat().st_size / 2**20:.1f} MiB")
    print(f"total {total / 2**20:.1f} MiB of the {LIMIT_BYTES / 2**20:.0f} MiB a device call carries")
    if total > LIMIT_BYTES:
        raise BundleError(f"the bundle is {total / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB")
    return 0


def install(bundle: Path, venv: Path) -> int:
    """On the host: venv (ours first, then the host's site-packages), packages, slim tritonserver."""
    import site
    import venv as venv_module

    host_site = [p for p in site.getsitepackages() if Path(p).is_dir()]
    venv_module.EnvBuilder(with_pip=False, clear=True, symlinks=True).create(venv)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    target = venv / "lib" / version / "site-packages"
    # The host's packages, through links, less those that need numpy 2 at import (transformers
    # imports scikit-learn, and so scipy, whenever it finds them).
    mirror = venv / "host-site-packages"
    mirror.mkdir()
    for directory in host_site:
        for entry in Path(directory).iterdir():
            if not entry.name.lower().startswith(HOST_EXCLUDED) and not (mirror / entry.name).exists():
                (mirror / entry.name).symlink_to(entry)
    # After the venv's own directory, so the bundled packages (numpy < 2) shadow the host's.
    (target / "zz_host_site_packages.pth").write_text(f"{mirror}\n")
    for name in (PACKAGES_ARCHIVE, TRITON_ARCHIVE):
        with tarfile.open(bundle / name) as tar:
            tar.extractall(target, filter="tar")
    with tarfile.open(bundle / TRITON_ARCHIVE) as tar:
        tar.extractall(target, filter="tar")
    print(f"{venv}: the bundled packages and the slim tritonserver, then the host's {', '.join(host_site)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.bundle_host",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="here: slim tritonserver + packages into --out")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--python", default="3.12", help="the host's Python version (default 3.12)")
    p.add_argument("--package", action="append", default=None, help="packages to carry (default: a list)")
    i = sub.add_parser("install", help="on the host: a venv with the packages and the slim tritonserver")
    i.add_argument("--bundle", type=Path, required=True)
    i.add_argument("--venv", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            return pack(args.out, args.python, tuple(args.package or HOST_PACKAGES))
        return install(args.bundle, args.venv)
    except (BundleError, subprocess.CalledProcessError, OSError) as exc:
        print(f"bundle_host {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
