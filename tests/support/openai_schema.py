"""Validate bodies against OpenAI's published OpenAPI schemas (tests/data/openai-openapi.json).

The document is OpenAPI 3.1 but still marks many optional nulls with 3.0's `nullable: true`,
which JSON Schema ignores: each such schema is rewritten as anyOf [schema, null] first.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

# In the repository, so that a fresh clone's tests read nothing outside it (tests/data/README.md
# names the upstream commit).
SPEC_PATH = Path(__file__).resolve().parents[1] / "data" / "openai-openapi.json"


def _spec_path() -> Path:
    return SPEC_PATH


def _fix_nullable(node: Any) -> Any:
    if isinstance(node, dict):
        fixed = {k: _fix_nullable(v) for k, v in node.items()}
        if fixed.pop("nullable", False) is True:
            return {"anyOf": [fixed, {"type": "null"}]}
        return fixed
    if isinstance(node, list):
        return [_fix_nullable(v) for v in node]
    return node


@functools.cache
def _document() -> dict[str, Any]:
    return _fix_nullable(json.loads(_spec_path().read_text(encoding="utf-8")))


def _with_streamed_completion_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """OpenAI streams legacy completions with `finish_reason: null` until the last chunk, though the
    spec says streamed and non-streamed objects share one shape with a non-null finish_reason.
    `CreateCompletionResponse.stream` is that schema with only this one field made nullable."""
    import copy

    schemas = doc["components"]["schemas"]
    streamed = copy.deepcopy(schemas["CreateCompletionResponse"])
    finish = streamed["properties"]["choices"]["items"]["properties"]["finish_reason"]
    streamed["properties"]["choices"]["items"]["properties"]["finish_reason"] = {
        "anyOf": [finish, {"type": "null"}]
    }
    # Likewise `usage: null` on every chunk but the last when include_usage is set (as chat
    # chunks, whose schema says so).
    usage = streamed["properties"]["usage"]
    streamed["properties"]["usage"] = {"anyOf": [usage, {"type": "null"}]}
    schemas["CreateCompletionResponse.stream"] = streamed
    return doc


@functools.cache
def validator(schema_name: str) -> Draft202012Validator:
    doc = _with_streamed_completion_schema(_document())
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    registry = Registry().with_resource("urn:openai", resource)
    schema = {"$ref": f"urn:openai#/components/schemas/{schema_name}"}
    return Draft202012Validator(schema, registry=registry)


def validate(schema_name: str, body: Any) -> None:
    """Raise jsonschema.ValidationError with every problem listed if `body` does not conform."""
    errors = sorted(validator(schema_name).iter_errors(body), key=lambda e: list(e.path))
    if errors:
        details = "\n".join(f"- {list(e.path)}: {e.message}" for e in errors[:10])
        raise AssertionError(f"{schema_name} validation failed:\n{details}\nbody: {json.dumps(body)[:2000]}")


def validated_responses_events(events: Iterable[Any]) -> Iterator[Any]:
    """The openai SDK's Responses stream events, each first checked against OpenAI's
    ResponseStreamEvent schema as the wire carries it: field names by their aliases, unset fields
    left out, without the snapshot the SDK accumulates."""
    for event in events:
        validate(
            "ResponseStreamEvent",
            event.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"snapshot"}),
        )
        yield event
