"""How to write this installation's `gateway` command so that it runs as printed, from the
directory it was started in: `gateway` only where the shell finds this very command by that name;
otherwise its path (`.venv/bin/gateway` after `make run`, whose venv is not activated)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def gateway_command(argv0: str | None = None, *, cwd: str | None = None, path: str | None = None) -> str:
    """The command that runs this `gateway` (its console script, or `python -m gateway.cli`)."""
    script = Path(argv0 if argv0 is not None else sys.argv[0])
    here = Path(cwd if cwd is not None else os.getcwd())
    if script.name == "gateway":
        return _runnable(script, here, path)
    # Started as a module (`python -m gateway.cli`): argv[0] is the module's file.
    return f"{_runnable(Path(sys.executable), here, path)} -m gateway.cli"


def _runnable(program: Path, here: Path, path: str | None) -> str:
    absolute = Path(os.path.abspath(here / program))
    found = shutil.which(program.name, path=path)
    if found is not None and os.path.realpath(found) == os.path.realpath(absolute):
        return program.name
    try:
        shown = str(absolute.relative_to(here))
    except ValueError:
        return shlex.quote(str(absolute))
    # A relative path runs only with a slash in it: `./gateway`, not `gateway`.
    return shlex.quote(shown if os.sep in shown else f".{os.sep}{shown}")
