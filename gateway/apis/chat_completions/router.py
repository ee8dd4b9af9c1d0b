"""POST /v1/chat/completions: get the service, prepare, then stream or answer whole."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.apis.chat_completions.protocol import ChatCompletion, ChatCompletionRequest
from gateway.apis.chat_completions.serving import ChatCompletionsService
from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.http.admission import admitted_priority
from gateway.http.routing import JsonBodyRoute
from gateway.http.services import service
from gateway.http.streaming import client_timeout, event_stream, session_id, until_disconnect

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/chat/completions", response_model=ChatCompletion)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Any:
    chat = service(request, ChatCompletionsService)
    prepared = await chat.prepare(
        body,
        timeout_s=client_timeout(request),
        session=session_id(request),
        priority=admitted_priority(request),
    )
    if body.stream:
        return await event_stream(request, chat.stream(prepared))
    return await until_disconnect(request, chat.create(prepared))
