"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over the core:
wire models, router, translation, stream writer and its own error mapping."""

from gateway.apis.messages.errors import PATH_PREFIX, error_shape
from gateway.apis.messages.ratelimit import anthropic_headers
from gateway.apis.messages.router import router
from gateway.apis.messages.serving import MessagesService
from gateway.http.api import Api

API = Api(
    "messages",
    router,
    MessagesService,
    error_prefix=PATH_PREFIX,
    error_shape=error_shape,
    rate_limit_headers=anthropic_headers,
)
