"""Anthropic's error body, checked strictly: what every error on /v1/messages must look like."""

from __future__ import annotations

import typing
from typing import Any

from anthropic.types.shared.error_type import ErrorType

# The SDK's error types, and `request_too_large`, which Anthropic's documentation gives for 413.
ERROR_TYPES = frozenset(typing.get_args(ErrorType)) | {"request_too_large"}


def validate_error(body: Any) -> None:
    assert isinstance(body, dict) and set(body) <= {"type", "error", "request_id"}, body
    assert body["type"] == "error", body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"type", "message"}, body
    assert error["type"] in ERROR_TYPES, body
    assert isinstance(error["message"], str) and error["message"], body


def assert_error(response: Any, status: int, kind: str | None = None, *, message: str | None = None) -> dict:
    """The response is an Anthropic error with this status (and type, and message part)."""
    assert response.status_code == status, response.text
    body = response.json()
    validate_error(body)
    if kind is not None:
        assert body["error"]["type"] == kind, body
    if message is not None:
        assert message in body["error"]["message"], body
    return body
