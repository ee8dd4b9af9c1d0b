"""POST /v1/completions: get the service, prepare, then stream or answer whole."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.apis.completions.protocol import Completion, CompletionRequest
from gateway.apis.completions.serving import CompletionsService
from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.http.admission import admitted_priority
from gateway.http.routing import JsonBodyRoute
from gateway.http.services import service
from gateway.http.streaming import client_timeout, event_stream, session_id, until_disconnect

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/completions", response_model=Completion)
async def create_completion(body: CompletionRequest, request: Request) -> Any:
    completions = service(request, CompletionsService)
    prepared, echoes = await completions.prepare(
        body,
        timeout_s=client_timeout(request),
        session=session_id(request),
        priority=admitted_priority(request),
    )
    if body.stream:
        return await event_stream(request, completions.stream(prepared, echoes))
    return await until_disconnect(request, completions.create(prepared, echoes))
