"""orjson when available (it is a dependency), the standard library otherwise: the hot path parses
one JSON object per streamed chunk, so the parser's speed is the load generator's ceiling."""

from __future__ import annotations

from typing import Any

try:
    import orjson

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

except ImportError:  # pragma: no cover - the fallback keeps the tool usable without orjson
    import json

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()
