"""``hermes`` (Hermes 2 Pro, Qwen 2.5/3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
blocks, possibly several, possibly after some text."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gateway.text.tool_calls.base import Region, ToolCallFormat, ValueRegion


def _region(opener: str, names: Collection[str] | None, parameters: Mapping[str, Any]) -> Region:
    return ValueRegion(opener, names, closer="</tool_call>")


FORMAT = ToolCallFormat("hermes", ("<tool_call>",), "", None, _region)
