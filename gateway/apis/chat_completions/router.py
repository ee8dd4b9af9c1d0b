from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.api.errors import ERROR_RESPONSES, Request
from gateway.api.routing import JsonBodyRoute
from gateway.api.streaming import client_timeout, event_stream, until_disconnect
from gateway.protocol.openai import ChatCompletion, ChatCompletionRequest

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/chat/completions", response_model=ChatCompletion)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    service = request.app.state.chat
    prepared = await service.prepare(body, timeout_s=client_timeout(request))
    if body.stream:
        return await event_stream(request, service.stream(prepared))
    return await until_disconnect(request, service.create(prepared))
