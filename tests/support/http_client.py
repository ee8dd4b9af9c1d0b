"""One HTTP client for the tests' plain requests to the servers they start.

`http_client.get(...)` and its siblings build a new client on every call, and each client loads the CA
bundle into a new TLS context (about 30 ms of CPU) even for `http://` URLs: a readiness loop polling
every 100 ms spent most of a core on that while the process it waited for needed the core to start.
The functions here take httpx's own arguments and defaults (a 5 s timeout) over one shared client,
whose connections are kept alive between calls; it is thread-safe.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import httpx

_client = httpx.Client(timeout=5.0)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return _client.get(url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return _client.post(url, **kwargs)


def stream(method: str, url: str, **kwargs: Any) -> AbstractContextManager[httpx.Response]:
    return _client.stream(method, url, **kwargs)
