"""A request shaped like the ones Claude Code 2.1 sends to /v1/messages (its structure, fields and
headers, taken from a recording; the texts and tool schemas here are our own)."""

from __future__ import annotations

from typing import Any

HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": (
        "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
        "prompt-caching-scope-2026-01-05,mid-conversation-system-2026-04-07,effort-2025-11-24,"
        "advanced-tool-use-2025-11-20"
    ),
    "anthropic-dangerous-direct-browser-access": "true",
    "x-api-key": "sk-local",
}
PATH = "/v1/messages?beta=true"


def _tool(name: str, properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The {name} tool. " + "It does one thing well and explains itself at length. " * 8,
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": properties,
            "required": list(properties)[:1],
            "additionalProperties": False,
        },
        **extra,
    }


def tools() -> list[dict[str, Any]]:
    text = {"type": "string", "description": "What to work on"}
    out = [
        _tool("Bash", {"command": text, "timeout": {"type": "number"}, "description": text}),
        _tool("Read", {"file_path": text, "offset": {"type": "integer"}, "limit": {"type": "integer"}}),
        _tool(
            "Edit",
            {"file_path": text, "old_string": text, "new_string": text, "replace_all": {"type": "boolean"}},
        ),
        _tool("Write", {"file_path": text, "content": text}),
        _tool("Glob", {"pattern": text, "path": text}),
        _tool("Grep", {"pattern": text, "path": text, "glob": text, "-n": {"type": "boolean"}}),
        _tool(
            "TodoWrite",
            {"todos": {"type": "array", "items": {"type": "object", "properties": {"content": text}}}},
        ),
        _tool("WebFetch", {"url": {"type": "string", "format": "uri"}, "prompt": text}),
        _tool("Agent", {"description": text, "prompt": text, "subagent_type": text}),
        _tool("Skill", {"skill": text}),
        _tool("ToolSearch", {"query": text, "max_results": {"type": "integer"}}),
        _tool("mcp__docs__search", {"query": text}, defer_loading=True),
    ]
    return out


def request(
    user_text: str = "Say hello", *, version: str = "2.1.328.b7f", stream: bool = True
) -> dict[str, Any]:
    return {
        "model": "tiny",
        "max_tokens": 32000,
        "stream": stream,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": '{"device_id":"0123abcd","account_uuid":"","session_id":"4f12c10b"}'},
        "system": [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version={version}; cc_entrypoint=cli; cch=9a1f2;",
            },
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
            {
                "type": "text",
                "text": "\nYou help the user with software tasks. " + "Be careful and precise. " * 40,
                "cache_control": {"type": "ephemeral", "ttl": "1h", "scope": "global"},
            },
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "<system-reminder>\nContext the agent adds.\n</system-reminder>",
                    },
                    {"type": "text", "text": user_text, "cache_control": {"type": "ephemeral"}},
                ],
            },
            {
                "role": "system",
                "content": [
                    {
                        "type": "text",
                        "text": "# Environment\nWorking directory: /work\nPlatform: linux",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "tools": tools(),
    }
