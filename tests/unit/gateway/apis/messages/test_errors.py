"""Anthropic's error bodies and statuses for every gateway error, and validation errors that
name the field the way Anthropic does."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from fastapi.exceptions import RequestValidationError

from gateway.apis.messages.errors import error_body, error_response, status_and_type, validation_error
from gateway.apis.messages.protocol import MessageCreateRequest
from gateway.errors import (
    AuthenticationError,
    ContextLengthExceededError,
    DeadlineExceededError,
    EngineError,
    EngineUnavailableError,
    GatewayError,
    InternalError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
)


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequestError("x"), 400, "invalid_request_error"),
        (ContextLengthExceededError("x"), 400, "invalid_request_error"),
        (AuthenticationError("x"), 401, "authentication_error"),
        (ModelNotFoundError("x"), 404, "not_found_error"),
        (PayloadTooLargeError("x"), 413, "request_too_large"),
        (OverloadedError("x"), 429, "rate_limit_error"),
        (InternalError("x"), 500, "api_error"),
        (EngineError("x"), 500, "api_error"),
        (EngineUnavailableError("x"), 529, "overloaded_error"),
        (DeadlineExceededError("x"), 504, "timeout_error"),
    ],
)
def test_gateway_errors_map_to_anthropic_statuses_and_types(
    error: GatewayError, status: int, kind: str
) -> None:
    assert status_and_type(error) == (status, kind)
    assert error_body(error) == {"type": "error", "error": {"type": kind, "message": "x"}}
    response = error_response(error)
    assert response.status_code == status


def test_retry_after_survives_on_a_rate_limit() -> None:
    response = error_response(OverloadedError("busy", headers={"Retry-After": "1"}))
    assert response.headers["retry-after"] == "1"


def invalid(body: dict[str, Any]) -> GatewayError:
    try:
        MessageCreateRequest.model_validate(body)
    except pydantic.ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        return validation_error(RequestValidationError(errors))
    raise AssertionError("the body was valid")


BASE: dict[str, Any] = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "tiny", "messages": BASE["messages"]}, "max_tokens: Field required"),
        ({**BASE, "max_tokens": "many"}, "max_tokens: Input should be a valid integer"),
        ({**BASE, "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({**BASE, "messages": "Hi"}, "messages: Input should be a valid list"),
        (
            {**BASE, "messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]},
            "messages.0.content.0: Input tag 'video' found using 'type' does not match",
        ),
        (
            {**BASE, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text.text: Field required",
        ),
        ({**BASE, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role: Input should be"),
        ({**BASE, "stop_sequences": "###"}, "stop_sequences: Input should be a valid list"),
        ({**BASE, "tool_choice": {"type": "sometimes"}}, "tool_choice: Input tag 'sometimes'"),
        ({**BASE, "thinking": {"type": "enabled"}}, "thinking.enabled.budget_tokens: Field required"),
    ],
)
def test_validation_errors_name_the_field_like_anthropic(body: dict[str, Any], message: str) -> None:
    error = invalid(body)
    assert error.status_code == 400
    assert error.message.startswith(message), error.message


def test_unknown_fields_and_betas_are_accepted() -> None:
    MessageCreateRequest.model_validate(
        {
            **BASE,
            "service_tier": "auto",
            "speed": "fast",
            "container": None,
            "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
            "metadata": {"user_id": '{"device_id": "x"}'},
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        }
    )
