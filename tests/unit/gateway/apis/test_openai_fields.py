"""Which unknown body field is a misspelling of a known one (and which is someone else's field)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.apis.chat_completions import protocol as chat
from gateway.apis.completions import protocol as completions
from gateway.apis.openai.fields import resembles
from gateway.apis.openai.protocol import KNOWN_EXTENSION_FIELDS
from gateway.apis.responses import protocol as responses
from tests.support.openai_schema import SPEC_PATH

KNOWN = chat.OPENAI_FIELDS | {"top_k", "min_tokens", "repetition_penalty"}


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("max_token", "max_tokens"),  # a letter dropped
        ("temprature", "temperature"),
        ("max_tokenss", "max_tokens"),  # one added
        ("temperatura", "temperature"),  # one changed
        ("tempreature", "temperature"),  # two swapped
        ("MaxTokens", "max_tokens"),  # case and separators
        ("max-completion-tokens", "max_completion_tokens"),
        ("tool", "tools"),
        ("logprob", "logprobs"),
        ("x_trace_label", None),  # nothing like any field
        ("top", None),  # too short to tell
        ("max_tkns", None),  # two edits away
    ],
)
def test_a_field_one_edit_from_a_known_one_resembles_it(name: str, meant: str | None) -> None:
    assert resembles(name, KNOWN) == meant


def test_other_servers_fields_are_not_taken_for_misspellings() -> None:
    # top_a (OpenRouter) is one edit from top_k and top_p; min_p (vLLM) and models (OpenRouter) too.
    assert {"top_a", "min_p", "models"} <= KNOWN_EXTENSION_FIELDS
    assert resembles("top_a", KNOWN) is not None  # which is why they are listed


def _defined(document: dict[str, Any], name: str) -> set[str]:
    schemas = document["components"]["schemas"]
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "$ref" in node:
            walk(schemas[node["$ref"].rsplit("/", 1)[1]])
            return
        for part in node.get("allOf", []):
            walk(part)
        found.update(node.get("properties", {}))

    walk(schemas[name])
    return found


def test_the_fields_openai_defines_are_those_of_its_openapi_document() -> None:
    document = json.loads(SPEC_PATH.read_text(encoding="utf-8"))
    assert _defined(document, "CreateChatCompletionRequest") == chat.OPENAI_FIELDS
    assert _defined(document, "CreateCompletionRequest") == completions.OPENAI_FIELDS
    assert _defined(document, "CreateResponse") == responses.OPENAI_FIELDS
    assert _defined(document, "TokenCountsBody") == responses.INPUT_TOKENS_FIELDS
