"""The APIs the gateway speaks, one folder each over the shared core (`gateway.core`). Adding an
API is adding its folder (wire models, router, translation, stream writer) and one line here."""

from typing import Any

from gateway.apis import (
    chat_completions,
    completions,
    embeddings,
    lora_adapters,
    messages,
    models,
    rerank,
    responses,
    score,
    tokenize,
)
from gateway.apis.openai.errors import error_body
from gateway.errors import GatewayError
from gateway.http.api import Api
from gateway.ratelimit import HeaderFormat, openai_headers

APIS: tuple[Api, ...] = (
    completions.API,
    chat_completions.API,
    responses.API,
    messages.API,
    models.API,
    lora_adapters.API,
    tokenize.API,
    embeddings.API,
    rerank.API,
    score.API,
)


def claiming(path: str) -> Api | None:
    """The API that claims `path` for its own error shape and rate-limit headers, if any does."""
    for api in APIS:
        if api.error_prefix is not None and path.startswith(api.error_prefix):
            return api
    return None


def error_shape(path: str, error: GatewayError) -> tuple[int, dict[str, Any]]:
    """The status and body of an error on `path`: the API that claims the path decides (the
    Messages API answers in Anthropic's shape), OpenAI's shape everywhere else."""
    api = claiming(path)
    if api is not None and api.error_shape is not None:
        return api.error_shape(path, error)
    return error.status_code, error_body(error)


def rate_limit_headers(path: str) -> HeaderFormat:
    """How rate-limit headers are written on `path`: by the API that claims it, as errors are."""
    api = claiming(path)
    if api is not None and api.rate_limit_headers is not None:
        return api.rate_limit_headers
    return openai_headers
