"""Publishing a cache directory whole: built under a temporary name beside its final path and renamed
into place, so a reader (another process, a later run after an interrupted build) finds no directory
or a complete one, never half of one."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path


def is_published(final: Path, marker: str | Sequence[str]) -> bool:
    """Whether `final` holds every marker file (a directory is renamed into place whole, so its
    markers are there exactly when it is complete)."""
    markers = (marker,) if isinstance(marker, str) else marker
    return all((final / name).is_file() for name in markers)


def publish_dir(
    final: Path,
    build: Callable[[Path], object],
    *,
    marker: str | Sequence[str],
    shared: bool = True,
) -> bool:
    """Build `final` with `build(directory)` unless it is published already (`marker`: the file or
    files a complete directory holds, relative to it).

    `final`'s name is keyed by what it is built from (a recipe's content, a requirement set), so a
    published directory is never stale and never replaced. Two processes building the same entry
    at once both build; the first rename wins and the other discards its copy. `shared`: readable by
    other users (the directory 0o755, its files 0o644), as mkdtemp makes it private and models are
    mounted into containers that run as other users.

    Returns whether this call published `final` (False: it was there already, or another process
    published it first)."""
    if is_published(final, marker):
        return False
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(building)
        if shared:
            building.chmod(0o755)
            for entry in building.iterdir():
                if entry.is_file() and not entry.is_symlink():
                    entry.chmod(0o644)
        try:
            building.rename(final)
        except OSError:
            # Another process won the race; its directory is complete because it was renamed whole.
            if not is_published(final, marker):
                raise
            return False
        return True
    finally:
        shutil.rmtree(building, ignore_errors=True)


def library_versions() -> list[str]:
    """The versions of tokenizers, transformers and torch, which a cached model's key includes
    (training and random initialization may change between them). Read from the packages'
    metadata, the same strings as their `__version__`: importing torch and transformers to ask
    costs seconds of CPU, paid by every `gateway dev` start that finds its model built."""
    return [version("tokenizers"), version("transformers"), version("torch")]
