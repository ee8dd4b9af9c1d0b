"""Clients whose pins cannot share the project's environment, each in a venv of its own under the
repository's `.cache/clients/` (git-ignored), made once per pinned requirement set and reused.

A user runs such a client in their own environment; so do the tests. instructor 1.17 wants
`jiter<0.15` and `rich<15`, while the `openai` SDK the project tests with wants `jiter>=0.16`: the
two cannot be installed side by side."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.publish import publish_dir

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "clients"


def client_python(name: str, requirements: Sequence[str]) -> Path:
    """The python of a venv with exactly `requirements` installed (pinned `NAME==VERSION`s), made
    under a temporary name and renamed into place, so an interrupted install is never reused."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    home = CACHE / f"{name}-{key}"
    python = home / "bin" / "python"

    def install(building: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
        subprocess.run(
            [
                str(building / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *requirements,
            ],
            check=True,
            env={**os.environ, "PIP_NO_INPUT": "1"},
        )

    # Only the venv's console scripts name the path it was made at; its python finds its packages
    # from where it stands, so the finished venv can be moved into place.
    publish_dir(home, install, marker="bin/python", shared=False)
    return python
