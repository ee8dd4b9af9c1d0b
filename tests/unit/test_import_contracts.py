"""The layers are contracts (pyproject.toml [tool.importlinter], run by `make lint`): the tree keeps
them, and an import planted across a layer breaks the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# One planted violation per contract: (file, import, the contract's name as reported).
PLANTED = [
    ("gateway/core/planted_api.py", "import gateway.apis.chat_completions.serving", "Layers:"),
    ("gateway/text/planted_core.py", "import gateway.core.models", "Layers:"),
    ("gateway/server.py", "import gateway.cli", "Layers:"),
    (
        "gateway/apis/completions/planted_chat.py",
        "from gateway.apis.chat_completions import protocol",
        "No API imports another API",
    ),
    ("gateway/http/planted_triton.py", "import tritonclient.grpc", "Only gateway.triton imports"),
    ("gateway/core/planted_torch.py", "import torch", "The gateway never imports torch"),
]


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # The copy under `root` comes first on the path, ahead of the installed (editable) package.
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_source_tree_keeps_every_layer_contract() -> None:
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_import_planted_across_a_layer_breaks_its_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for file, line, _ in PLANTED:
        path = tmp_path / file
        existing = path.read_text() if path.exists() else '"""Planted by a test."""\n'
        path.write_text(existing + f"\n{line}  # planted\n")
    result = _lint_imports(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    broken = _broken_contracts(out)
    for file, _, contract in PLANTED:
        # Each planted import is reported, under the contract it breaks.
        module = file.removesuffix(".py").replace("/", ".")
        assert f"{module} -> " in out, (module, out)
        assert any(name.startswith(contract) for name in broken), (contract, out)


def _broken_contracts(out: str) -> list[str]:
    # Long contract names wrap in the report: join each one back up to its KEPT / BROKEN.
    joined, current = [], ""
    for ln in out.splitlines():
        current = f"{current} {ln.strip()}".strip()
        if current.endswith(("KEPT", "BROKEN")):
            joined.append(current)
            current = ""
        elif not ln.strip():
            current = ""
    return [j for j in joined if j.endswith("BROKEN")]


def test_make_lint_runs_the_contracts_and_ci_runs_make_lint() -> None:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "lint-imports" in recipe
    assert "make lint" in (REPO / ".ci" / "run").read_text()
