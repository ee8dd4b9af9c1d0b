"""The APIs the gateway speaks, one folder each over the shared core (`gateway.core`). Adding an
API is adding its folder (wire models, router, translation, stream writer) and one line here."""

from typing import Any

from gateway.apis import chat_completions, completions, messages, models, responses
from gateway.apis.openai.errors import error_body
from gateway.errors import GatewayError
from gateway.http.api import Api
from gateway.ratelimit import HeaderFormat, openai_headers

APIS: tuple[Api, ...] = (completions.API, chat_completions.API, responses.API, messages.API, models.API)


def error_shape(path: str, error: GatewayError) -> tuple[int, dict[str, Any]]:
    """The status and body of an error on `path`: the API that claims the path decides (the
    Messages API answers in Anthropic's shape), OpenAI's shape everywhere else."""
    for api in APIS:
        if api.error_shape is not None and api.error_prefix is not None and path.startswith(api.error_prefix):
            return api.error_shape(path, error)
    return error.status_code, error_body(error)


def rate_limit_headers(path: str) -> HeaderFormat:
    """How rate-limit headers are written on `path`: by the API that claims it, as errors are."""
    for api in APIS:
        if (
            api.rate_limit_headers is not None
            and api.error_prefix is not None
            and path.startswith(api.error_prefix)
        ):
            return api.rate_limit_headers
    return openai_headers
