"""Tool calling: finding calls in model output (whole or streamed) and checking `tools` /
`tool_choice`, with the JSON schema that forces a call under guided decoding."""

from gateway.text.tool_calls.choice import (
    FunctionTool,
    ToolChoice,
    output_format,
    resolve_tool_choice,
    tool_call_json_schema,
    validate_tools,
)
from gateway.text.tool_calls.parsing import (
    FORMATS,
    ContentDelta,
    ParsedOutput,
    StreamingToolParser,
    ToolCall,
    ToolCallArguments,
    ToolCallEvent,
    ToolCallStart,
    check_format,
    finish_reason,
    new_tool_call_id,
    parse_tool_calls,
)

__all__ = [
    "FORMATS",
    "ContentDelta",
    "FunctionTool",
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
