"""One exception hierarchy, with each error's HTTP status and OpenAI-style type and code. Each API
maps it to its own error body in one place (OpenAI's: `gateway.apis.openai.errors`)."""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the gateway reports to a client."""

    status_code = 500
    error_type = "server_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers or {}


class InvalidRequestError(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class UnsupportedParameterError(InvalidRequestError):
    default_code = "unsupported_parameter"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class NotFoundError(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class MethodNotAllowedError(GatewayError):
    status_code = 405
    error_type = "invalid_request_error"


class ClientDisconnectedError(GatewayError):
    """The client went away before its response was sent. 499 is nginx's code for it: not a
    4xx of the client's request, and no body is read; the status is for logs, metrics and traces."""

    status_code = 499
    error_type = "client_closed_request"
    default_code = "client_closed_request"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "payload_too_large"


class OverloadedError(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "overloaded"


class RateLimitError(GatewayError):
    """A key's requests or tokens per minute are used up. OpenAI's body names the limit that was
    hit in `type` (`requests` or `tokens`) with the code `rate_limit_exceeded`."""

    status_code = 429
    error_type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message, headers=headers)
        self.error_type = kind


class EngineError(GatewayError):
    """Triton answered with an error for this request."""

    status_code = 502
    error_type = "server_error"
    default_code = "engine_error"


class EngineUnavailableError(GatewayError):
    """Triton cannot be reached, or the model is not ready."""

    status_code = 503
    error_type = "server_error"
    default_code = "engine_unavailable"


class StateUnavailableError(GatewayError):
    """The state server (`--state-url`: Redis or Valkey) cannot be reached or failed."""

    status_code = 503
    error_type = "server_error"
    default_code = "state_unavailable"


class DeadlineExceededError(GatewayError):
    status_code = 504
    error_type = "server_error"
    default_code = "timeout"


class ClientDeadlineExceededError(DeadlineExceededError):
    """The deadline the client chose (X-Request-Timeout) passed: its choice, not a server fault."""


class ServerConfigError(GatewayError):
    """The gateway's own configuration is wrong; raised at start-up, or per request where only
    Triton's answer at run time shows it (a model's route that cannot serve its reasoning format)."""


class InternalError(GatewayError):
    pass


def to_gateway_error(exc: BaseException) -> GatewayError:
    """The single place where an arbitrary exception becomes what a client sees.

    Unknown exceptions turn into a plain 500 whose message names no internals.
    """
    if isinstance(exc, GatewayError):
        return exc
    return InternalError("The server had an error while processing your request.")
