"""Polling for a condition, bounded in time: for state with no event to wait on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(condition: Callable[[], bool], *, timeout: float = 5.0, interval: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)
