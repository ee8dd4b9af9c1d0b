"""Items as stored and listed (`input_items`): each with an id and a status, messages with a list
of content parts, as the spec's ItemResource shapes them. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.apis.responses.protocol import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    ItemReference,
    Message,
    Reasoning,
)
from gateway.apis.responses.stream import new_item_id
from gateway.errors import InvalidRequestError


def _input_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "input_image":
        # Kept with its URL (or data: URI): a later turn renders the conversation again.
        return {"type": "input_image", "image_url": part["image_url"], "detail": part.get("detail") or "auto"}
    return {"type": "input_text", "text": part["text"]}


def resource(item: InputItem) -> dict[str, Any]:
    """An input item as it is kept: the fields the spec defines, an id made when it had none."""
    if isinstance(item, Message):
        if item.role == "assistant":
            content = item.content
            parts = (
                [{"type": "output_text", "text": content, "annotations": []}]
                if isinstance(content, str)
                else [_output_part(p) for p in content]
            )
            return {
                "id": item.id or new_item_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": item.status or "completed",
                "content": parts,
            }
        parts = (
            [{"type": "input_text", "text": item.content}]
            if isinstance(item.content, str)
            else [_input_part(p) for p in item.content]
        )
        return {
            "id": item.id or new_item_id("msg"),
            "type": "message",
            "role": item.role,
            "status": item.status or "completed",
            "content": parts,
        }
    if isinstance(item, FunctionCall):
        out: dict[str, Any] = {
            "id": item.id or new_item_id("fc"),
            "type": "function_call",
            "status": item.status or "completed",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments,
        }
        if item.namespace:
            out["namespace"] = item.namespace
        return out
    if isinstance(item, FunctionCallOutput):
        output = item.output if isinstance(item.output, str) else [dict(p) for p in item.output]
        return {
            "id": item.id or new_item_id("fco"),
            "type": "function_call_output",
            "status": item.status or "completed",
            "call_id": item.call_id,
            "output": output,
        }
    if isinstance(item, Reasoning):
        kept: dict[str, Any] = {
            "id": item.id or new_item_id("rs"),
            "type": "reasoning",
            "summary": [s.model_dump() for s in item.summary],
        }
        if item.content is not None:
            kept["content"] = [c.model_dump() for c in item.content]
        if item.encrypted_content is not None:
            kept["encrypted_content"] = item.encrypted_content
        return kept
    raise AssertionError(f"unresolved item {item!r}")


def _output_part(part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "refusal":
        return {"type": "refusal", "refusal": part["refusal"]}
    return {"type": "output_text", "text": part["text"], "annotations": []}


def resolve_references(
    items: Sequence[InputItem], known: Sequence[dict[str, Any]], parse: Any
) -> list[InputItem]:
    """Item references replaced by the items they name, from the earlier conversation."""
    by_id = {k["id"]: k for k in known if "id" in k}
    out: list[InputItem] = []
    for i, item in enumerate(items):
        if isinstance(item, ItemReference):
            found = by_id.get(item.id)
            if found is None:
                raise InvalidRequestError(
                    f"Item with id {item.id!r} not found.", param=f"input[{i}].id", code="item_not_found"
                )
            out.extend(parse([found]))
        else:
            out.append(item)
    return out


def page(
    items: Sequence[dict[str, Any]], *, limit: int, order: str, after: str | None
) -> tuple[list[dict[str, Any]], bool]:
    """One page of `input_items`: up to `limit` items after the one with id `after`, in `order`."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    start = 0
    if after is not None:
        ids = [i.get("id") for i in ordered]
        if after not in ids:
            raise InvalidRequestError(f"No item with id {after!r} in this response's input.", param="after")
        start = ids.index(after) + 1
    chunk = ordered[start : start + limit]
    return chunk, start + limit < len(ordered)
