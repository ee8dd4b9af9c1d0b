"""deploy.devstack refuses, in one line, a Python environment the Triton Python backend stub breaks in."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from deploy import devstack
from deploy.devstack import TritonServer, TritonStartError, check_stub_environment

OURS = f"{sys.version_info.major}.{sys.version_info.minor}"


def _fake_numpy(tmp_path: Path, version: str) -> dict[str, str]:
    package = tmp_path / "numpy"
    package.mkdir()
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def _fake_python(tmp_path: Path, line: str) -> str:
    script = tmp_path / "python3"
    script.write_text(f"#!/bin/sh\necho '{line}'\n")
    script.chmod(0o755)
    return str(script)


def test_this_projects_environment_passes() -> None:
    check_stub_environment()


def test_numpy_2_in_the_stubs_environment_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(TritonStartError) as caught:
        check_stub_environment(_fake_numpy(tmp_path, "2.5.2"))
    message = str(caught.value)
    assert "\n" not in message
    assert "numpy 2.5.2" in message and "numpy<2" in message and "0-token" in message


def test_numpy_1_passes(tmp_path: Path) -> None:
    check_stub_environment(_fake_numpy(tmp_path, "1.26.4"))


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        ("3.99|True|libpython3.99.so.1.0|1.26.4", f"is for Python {OURS} but python3"),
        (f"{OURS}|False||1.26.4", "shared libpython (none), which is not installed"),
        (f"{OURS}|True|libpython{OURS}.so.1.0|missing: No module named 'numpy'", "needs numpy < 2"),
        (f"{OURS}|True|libpython{OURS}.so.1.0|2.0.0", "numpy 2.0.0"),
    ],
)
def test_what_breaks_the_stub_is_named(tmp_path: Path, probe: str, expected: str) -> None:
    with pytest.raises(TritonStartError, match=re.escape(expected)) as caught:
        check_stub_environment(python=_fake_python(tmp_path, probe))
    assert "\n" not in str(caught.value)


def test_triton_is_not_started_when_the_stub_would_break(tmp_path: Path) -> None:
    server = TritonServer([tmp_path], work_dir=tmp_path / "work", env=_fake_numpy(tmp_path, "2.1.0"))
    with pytest.raises(TritonStartError, match=re.escape("numpy 2.1.0")):
        server.start()
    assert server.pid is None and not server.is_running()


def test_the_devstack_command_refuses_with_one_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _fake_numpy(tmp_path / "np", "2.1.0") if (tmp_path / "np").mkdir() is None else {}
    monkeypatch.setenv("PYTHONPATH", fake["PYTHONPATH"])
    monkeypatch.setattr(
        devstack,
        "prepare_dev_repository",
        lambda out, **kw: devstack.DevRepository(tmp_path, tmp_path, "current", "synthetic", "ensemble"),
    )
    assert devstack.main(["--work-dir", str(tmp_path / "w")]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors[0].startswith("numpy 2.1.0 in the Python backend stub's environment")
    assert "\n" not in errors[0]
