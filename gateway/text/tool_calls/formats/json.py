"""``json``: the reply is one call object or an array of them, nothing else; this is what the
model writes under the schema from `tool_call_json_schema` (guided decoding), whatever its native
format. Not a model setting: chosen per request when guided decoding forces a call."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.text.tool_calls.base import Region, ToolCallFormat, ValueRegion


def _region(opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> Region:
    return ValueRegion(opener, names, allow_array=True, require_arguments=True)


FORMAT = ToolCallFormat("json", (), "{[", None, _region)
