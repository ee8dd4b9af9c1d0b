"""deploy.devstack raises net.core.wmem_default while tritonservers start and puts it back after the
last is ready (Triton's HTTP frontend loses generate_stream responses when its threads' command
sockets fill; `loadtest.triton_http_drops` measures it). A file stands in for the sysctl."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import devstack


def test_raised_for_every_holder_and_restored_after_the_last(tmp_path: Path) -> None:
    sysctl = tmp_path / "wmem_default"
    sysctl.write_text("212992\n")
    buffers = devstack._SendBuffers(sysctl)
    assert buffers.raise_to(1 << 25) == (True, True)
    assert sysctl.read_text() == str(1 << 25)
    # A second server starting meanwhile holds it too, and never lowers it.
    assert buffers.raise_to(1 << 20) == (True, True)
    assert sysctl.read_text() == str(1 << 25)
    buffers.release()
    assert sysctl.read_text() == str(1 << 25)
    buffers.release()
    assert sysctl.read_text() == "212992"
    buffers.release()  # more releases than holds change nothing
    assert sysctl.read_text() == "212992"


def test_a_host_already_set_high_enough_is_left_alone(tmp_path: Path) -> None:
    sysctl = tmp_path / "wmem_default"
    sysctl.write_text("67108864\n")
    buffers = devstack._SendBuffers(sysctl)
    assert buffers.raise_to(1 << 25) == (True, False)
    buffers.release()
    assert sysctl.read_text() == "67108864\n"


def test_an_unreadable_or_unwritable_sysctl_is_reported_not_raised(tmp_path: Path) -> None:
    assert devstack._SendBuffers(tmp_path / "missing").raise_to(1 << 25) == (False, False)

    class ReadOnly(type(tmp_path)):  # type: ignore[misc]
        def write_text(self, *args: object, **kwargs: object) -> int:
            raise PermissionError("read-only /proc/sys")

    sysctl = tmp_path / "wmem_default"
    sysctl.write_text("212992")
    assert devstack._SendBuffers(ReadOnly(sysctl)).raise_to(1 << 25) == (False, False)
    assert sysctl.read_text() == "212992"


def test_triton_server_holds_the_raise_until_ready_or_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysctl = tmp_path / "wmem_default"
    sysctl.write_text("212992")
    monkeypatch.setattr(devstack, "_SEND_BUFFERS", devstack._SendBuffers(sysctl))
    server = devstack.TritonServer([tmp_path], work_dir=tmp_path / "w", http_send_buffer=1 << 25)
    in_force, held = devstack._SEND_BUFFERS.raise_to(1 << 25)  # as start() does
    server.http_send_buffer_applied, server._holds_send_buffers = in_force, held
    assert sysctl.read_text() == str(1 << 25)
    server.stop()  # never started: releases all the same
    assert sysctl.read_text() == "212992"
