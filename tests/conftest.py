"""How `make test` shares the suite between its pytest-xdist workers (`--dist loadgroup`).

Each test module is one unit of work, so a module's fixtures (a Triton server, a gateway) start once,
on one worker. Every test that uses the session's shared Triton stack (tests/integration/conftest.py:
some forty Python models, minutes to start) is in one unit, so the stack starts once, and that unit
goes first: it is the longest, and the other worker runs the rest of the suite beside it. Without
xdist the markers do nothing and the order is the same but for the stack's tests coming first.
"""

from __future__ import annotations

import pytest

STACK_GROUP = "triton_stack"


def _group(item: pytest.Item) -> str:
    """A module's own `xdist_group` mark (a module that asks for the stack as it runs), else the
    stack's group for a test that uses it, else the test's module."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return STACK_GROUP if STACK_GROUP in item.fixturenames else item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Before xdist's own hook, which turns the marker into the test's work unit.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_group(item)))
    # The stack's unit first, then the other integration modules (each a server or two to start),
    # then the many quick modules, which keep both workers busy to the end. A stable sort: each
    # module's tests keep their order.
    items.sort(key=_rank)


def _rank(item: pytest.Item) -> int:
    if _group(item) == STACK_GROUP:
        return 0
    return 1 if item.nodeid.startswith("tests/integration/") else 2
