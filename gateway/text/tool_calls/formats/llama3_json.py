"""``llama3_json`` (Llama 3.1-3.3): the whole reply is ``{"name": ..., "parameters": {...}}``
(``"arguments"`` also accepted), optionally after ``<|python_tag|>``; several calls are separated by
``;``. A bare ``{`` opens a call only at the very start of the reply, so a JSON example inside prose
stays prose; ``<|python_tag|>`` opens one anywhere."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.text.tool_calls.base import Region, ToolCallFormat, ValueRegion


def _region(opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> Region:
    return ValueRegion(opener, names, require_arguments=opener == "")


FORMAT = ToolCallFormat("llama3_json", ("<|python_tag|>",), "{", ";", _region)
