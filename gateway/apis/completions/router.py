from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.api.errors import ERROR_RESPONSES, Request
from gateway.api.routing import JsonBodyRoute
from gateway.api.streaming import client_timeout, event_stream, until_disconnect
from gateway.protocol.openai import Completion, CompletionRequest

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/completions", response_model=Completion)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    service = request.app.state.completions
    prepared, echoes = await service.prepare(body, timeout_s=client_timeout(request))
    if body.stream:
        return await event_stream(request, service.stream(prepared, echoes))
    return await until_disconnect(request, service.create(prepared, echoes))
