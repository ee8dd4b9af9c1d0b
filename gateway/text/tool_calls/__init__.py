"""Tool calling: finding calls in model output (whole or streamed) and checking `tools` /
`tool_choice`, with the JSON schema that forces a call under guided decoding."""

from gateway.text.tool_calls.base import (
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolCallArguments,
    ToolCallEvent,
    ToolCallStart,
    finish_reason,
    new_tool_call_id,
)
from gateway.text.tool_calls.choice import (
    FunctionTool,
    ToolChoice,
    output_format,
    resolve_tool_choice,
    tool_call_json_schema,
    validate_tools,
)
from gateway.text.tool_calls.json_text import JsonScanner
from gateway.text.tool_calls.parsing import ForcedToolParser, StreamingToolParser, parse_tool_calls
from gateway.text.tool_calls.registry import FORMATS, MODEL_FORMATS, check_format

__all__ = [
    "FORMATS",
    "MODEL_FORMATS",
    "ContentDelta",
    "ForcedToolParser",
    "FunctionTool",
    "JsonScanner",
    "ParsedOutput",
    "StreamingToolParser",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallEvent",
    "ToolCallStart",
    "ToolChoice",
    "check_format",
    "finish_reason",
    "new_tool_call_id",
    "output_format",
    "parse_tool_calls",
    "resolve_tool_choice",
    "tool_call_json_schema",
    "validate_tools",
]
