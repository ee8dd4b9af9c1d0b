"""deploy/bundle_host.py: the slim tritonserver takes only the bundled libraries ldd resolves; the
packages come from pyproject.toml's requirements less what the host image has, and with the host's
they import the whole gateway, load generator and deploy."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from deploy.bundle_host import (
    HOST_EXCLUDED,
    HOST_IMAGE,
    _canonical,
    _site_root,
    families_archive,
    project_requirements,
    resolve,
    resolved_libraries,
)

ROOT = Path(__file__).resolve().parents[3]


def test_ldd_resolves_the_bundled_libraries_tritonserver_needs_and_no_others() -> None:
    package, libs_dir = _site_root()
    binaries = [
        package / "tritonserver" / "bin" / "tritonserver",
        package / "tritonserver" / "backends" / "python" / "libtriton_python.so",
    ]
    found, missing = resolved_libraries(binaries, libs_dir)
    names = {p.name for p in found}
    assert any(n.startswith("libtritonserver") for n in names)
    assert all(p.parent == libs_dir.resolve() for p in found)
    # Fewer than the wheel carries: that is the slimming.
    assert len(found) < len(list(libs_dir.iterdir()))
    assert not missing


def test_the_host_provides_what_it_has_in_a_version_every_requirer_accepts() -> None:
    host = {
        "safetensors": "0.8.0",
        "numpy": "2.5.2",
        "transformers": "4.57.0",
        "jinja2": None,
        "ml-dtypes": None,
        "pyyaml": None,
    }
    resolved = resolve(
        ["safetensors==0.8.0", "jinja2==3.1.6", "transformers==5.23.0", "tritonclient[grpc]==2.73.0"],
        "3.12",
        host,
    )
    carried = dict(resolved.carried)
    from_host = dict(resolved.from_host)
    # A known version within the pin's major version; a version not read, asked only for a lower
    # bound or the pin's major version (jinja2 3.x).
    assert {"safetensors", "jinja2"} <= set(from_host), resolved
    # Another major version than the one pinned: carried, at the version installed here.
    assert carried["transformers"] == importlib.metadata.version("transformers")
    # numpy 2 never (tritonclient asks numpy>=1.19.1, which 2.5.2 satisfies, and the pin's 1.x
    # does not): the Python backend stub needs numpy < 2.
    assert carried["numpy"] == importlib.metadata.version("numpy") < "2"
    # An upper bound below the next major version needs a version: tritonclient's ml-dtypes<=0.5.4.
    assert "ml-dtypes" in carried and "tritonclient" in carried
    # The extra's requirements are followed (tritonclient[grpc] needs grpcio and protobuf).
    assert "grpcio" in carried and "protobuf" in carried
    # What only a package the host provides needs is the host's business (transformers' pyyaml is
    # needed by the carried transformers, so it is the host's by its own rule).
    assert "markupsafe" not in carried and "pyyaml" in from_host


def _top_level_modules(distributions: set[str]) -> set[str]:
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if any(_canonical(d) in distributions for d in dists)
    }


_IMPORT_ALL = """
import importlib, pkgutil, sys
blocked = set(sys.argv[1].split(","))

class OnlyTheBundle:
    # An installed package that neither the bundle nor the host image has is not there on the host.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, OnlyTheBundle())
count = 0
for package in ("gateway", "loadtest", "deploy"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.rpartition(".")[2] != "__main__":
            importlib.import_module(info.name)
            count += 1
print(count)
"""


def test_the_bundle_and_the_host_image_import_every_module_of_the_gateway_the_load_generator_and_deploy() -> (
    None
):
    resolved = resolve(project_requirements(), "3.12")
    carried = {name for name, _ in resolved.carried}
    # What the host's venv sees: the bundle first, then the host's packages less those it hides.
    host = {_canonical(n) for n in HOST_IMAGE if not n.lower().replace("-", "_").startswith(HOST_EXCLUDED)}
    installed = set(importlib.metadata.packages_distributions())
    allowed = _top_level_modules(carried | host) | {"gateway", "loadtest", "deploy"}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, ",".join(sorted(installed - allowed))],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 100
    # The gateway's imports the host image lacks are carried (gpt-oss's harmony parser among them).
    assert {"openai-harmony", "fastapi", "uvicorn", "tritonclient", "numpy"} <= carried


def test_the_bundled_family_tokenizers_are_found_where_the_host_looks_for_them(tmp_path: Path) -> None:
    from deploy import families

    archive = families_archive(tmp_path, ["llama2"])
    cache = tmp_path / "families"
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="tar")
    # Found unpacked: nothing fetched (the host has no network).
    assert families.tokenizer_dir("llama2", cache=cache).parent == cache
    assert not list(cache.glob("*.tgz"))
