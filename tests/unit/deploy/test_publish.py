"""A cache directory is published whole: built beside its final path, renamed into place, and a
concurrent builder's copy discarded."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from deploy.publish import is_published, publish_dir


def _write(out: Path, text: str = "ours") -> None:
    (out / "config.json").write_text(text)
    (out / "weights.bin").write_bytes(b"\0" * 4)
    (out / "weights.bin").chmod(0o600)  # as a writer through a temporary file leaves it


def test_a_built_directory_is_renamed_into_place_readable_by_others(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "tiny-abc123"
    assert publish_dir(final, _write, marker="config.json") is True
    assert (final / "config.json").read_text() == "ours"
    assert stat.S_IMODE(final.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in final.iterdir()} == {0o644}
    assert [p.name for p in final.parent.iterdir()] == [final.name]  # nothing left beside it


def test_a_published_directory_is_not_built_again(tmp_path: Path) -> None:
    final = tmp_path / "tiny-abc123"
    publish_dir(final, _write, marker="config.json")

    def fail(out: Path) -> None:
        raise AssertionError("built twice")

    assert publish_dir(final, fail, marker=("config.json", "weights.bin")) is False


def test_the_loser_of_a_race_discards_its_copy_and_keeps_the_winners(tmp_path: Path) -> None:
    final = tmp_path / "tiny-abc123"

    def race(out: Path) -> None:
        # Another process publishes the same entry while this one builds.
        final.mkdir()
        _write(final, "theirs")
        _write(out)

    assert publish_dir(final, race, marker="config.json") is False
    assert (final / "config.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    final = tmp_path / "tiny-abc123"

    def broken(out: Path) -> None:
        (out / "config.json").write_text("half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        publish_dir(final, broken, marker="config.json")
    assert list(tmp_path.iterdir()) == []


def test_an_incomplete_directory_in_the_way_is_an_error_not_a_result(tmp_path: Path) -> None:
    final = tmp_path / "tiny-abc123"
    final.mkdir()
    (final / "stray").write_text("")
    with pytest.raises(OSError):
        publish_dir(final, _write, marker="config.json")
    assert not is_published(final, "config.json")
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_an_unshared_directory_keeps_its_modes_and_links(tmp_path: Path) -> None:
    target = tmp_path / "python3"
    target.write_text("")
    target.chmod(0o700)
    final = tmp_path / "venv-abc123"

    def venv(out: Path) -> None:
        (out / "bin").mkdir()
        (out / "bin" / "python").symlink_to(target)

    assert publish_dir(final, venv, marker="bin/python", shared=False) is True
    assert stat.S_IMODE(final.stat().st_mode) == 0o700  # as mkdtemp made it
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
