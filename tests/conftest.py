"""How `make test` shares the suite between its pytest-xdist workers.

Each test module is one unit of work, so a module's fixtures (a Triton server, a gateway) start once,
on one worker. Every module that uses the session's shared Triton stack (tests/integration/conftest.py:
some forty Python models, minutes to start, gigabytes of memory) is in one unit, so the stack starts
once, and that unit goes first: it is the longest, and the other worker runs the rest of the suite
beside it. A module uses the stack when its source names the `triton_stack` fixture, also where it
asks for it as it runs (`request.getfixturevalue`). (xdist's own `--dist loadgroup` would do this
from marks, but it renames tests to do it, which this pytest no longer lets it.)
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest

STACK_GROUP = "triton_stack"


@functools.cache
def _uses_stack(module: Path) -> bool:
    try:
        return STACK_GROUP in module.read_text(encoding="utf-8")
    except OSError:
        return False


def work_unit(root: Path, nodeid: str) -> str:
    """The worker-sized unit a test belongs to: the stack's group, or its module."""
    module = nodeid.split("::", 1)[0]
    return STACK_GROUP if _uses_stack(root / module) else module


def _rank(root: Path, item: pytest.Item) -> int:
    if work_unit(root, item.nodeid) == STACK_GROUP:
        return 0
    # Then the other integration modules (each a server or two to start), then the many quick
    # modules, which keep both workers busy to the end.
    return 1 if item.nodeid.startswith("tests/integration/") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: each module's tests keep their order. xdist hands out units in this order.
    items.sort(key=lambda item: _rank(config.rootpath, item))


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        """xdist's scope scheduling (a unit goes whole to one worker) over `work_unit`."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(self.config.rootpath, nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
        return ModuleScheduling(config, log) if config.getvalue("dist") == "loadscope" else None
