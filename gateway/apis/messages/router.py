"""POST /v1/messages and /v1/messages/count_tokens: get the service, prepare, then stream or
answer whole. Errors leave in Anthropic's shape through the route class."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.apis.messages.errors import ERROR_RESPONSES, AnthropicRoute
from gateway.apis.messages.protocol import (
    Message,
    MessageCountTokensRequest,
    MessageCreateRequest,
    MessageTokensCount,
)
from gateway.apis.messages.serving import MessagesService
from gateway.apis.messages.stream import ping_event
from gateway.http.admission import admitted_priority
from gateway.http.services import service
from gateway.http.streaming import client_timeout, event_stream, session_id, until_disconnect

router = APIRouter(responses=ERROR_RESPONSES, route_class=AnthropicRoute, tags=["messages"])


@router.post("/v1/messages", response_model=Message)
async def create_message(body: MessageCreateRequest, request: Request) -> Any:
    messages = service(request, MessagesService)
    prepared = await messages.prepare(
        body,
        timeout_s=client_timeout(request),
        priority=admitted_priority(request),
        session=session_id(request),
    )
    if body.stream:
        return await event_stream(request, messages.stream(prepared), ping=ping_event)
    return await until_disconnect(request, messages.create(prepared))


@router.post("/v1/messages/count_tokens", response_model=MessageTokensCount)
async def count_message_tokens(body: MessageCountTokensRequest, request: Request) -> Any:
    messages = service(request, MessagesService)
    return await messages.count_tokens(body)
