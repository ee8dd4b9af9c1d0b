"""A printed `gateway` command runs as printed: by name only where the shell finds this very
command by that name, else by its path from where it was started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gateway.invocation import gateway_command


def _script(at: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.write_text("#!/bin/sh\n")
    at.chmod(0o755)
    return at


def test_the_venvs_gateway_outside_path_is_written_as_its_path(tmp_path: Path) -> None:
    _script(tmp_path / ".venv" / "bin" / "gateway")
    other = _script(tmp_path / "elsewhere" / "gateway").parent
    # As `make run` starts it, from the repository root with the venv not activated.
    for search in ("/usr/bin", str(other)):
        assert gateway_command(".venv/bin/gateway", cwd=str(tmp_path), path=search) == ".venv/bin/gateway"
    # The same script given by its absolute path, from the same directory.
    absolute = str(tmp_path / ".venv" / "bin" / "gateway")
    assert gateway_command(absolute, cwd=str(tmp_path), path="/usr/bin") == ".venv/bin/gateway"
    # From a directory it is not under: the absolute path.
    assert gateway_command(absolute, cwd=str(other), path="/usr/bin") == absolute


def test_a_gateway_the_shell_finds_by_name_is_written_by_name(tmp_path: Path) -> None:
    bin_dir = _script(tmp_path / ".venv" / "bin" / "gateway").parent
    search = os.pathsep.join(["/usr/bin", str(bin_dir)])
    assert gateway_command(str(bin_dir / "gateway"), cwd="/", path=search) == "gateway"


def test_a_path_with_a_space_is_quoted_and_a_bare_name_gets_dot_slash(tmp_path: Path) -> None:
    spaced = _script(tmp_path / "my tools" / "gateway")
    assert gateway_command(str(spaced), cwd=str(tmp_path / ".venv"), path="/usr/bin") == f"'{spaced}'"
    _script(tmp_path / "gateway")
    assert gateway_command("gateway", cwd=str(tmp_path), path="/usr/bin") == "./gateway"


def test_the_module_form_is_written_with_this_python(tmp_path: Path) -> None:
    command = gateway_command(str(tmp_path / "gateway" / "cli.py"), cwd=str(tmp_path), path="")
    assert command.endswith(" -m gateway.cli")
    assert (
        Path(command.removesuffix(" -m gateway.cli").strip("'")).resolve() == Path(sys.executable).resolve()
    )
