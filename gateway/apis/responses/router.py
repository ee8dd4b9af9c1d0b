"""The Responses API's routes: get the service, call it, return a model or an event stream."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.apis.responses.protocol import (
    CreateResponseRequest,
    InputTokens,
    InputTokensRequest,
    Response,
    ResponseDeleted,
    ResponseItemList,
)
from gateway.apis.responses.serving import ResponsesService
from gateway.http.admission import admitted_priority
from gateway.http.routing import JsonBodyRoute
from gateway.http.services import service
from gateway.http.streaming import client_timeout, event_stream, session_id, until_disconnect

generation = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)
stored = APIRouter(responses=ERROR_RESPONSES)


def _service(request: Request) -> ResponsesService:
    return service(request, ResponsesService)


@generation.post("/v1/responses", response_model=Response)
async def create_response(body: CreateResponseRequest, request: Request) -> Any:
    service = _service(request)
    prepared = await service.prepare(
        body,
        timeout_s=client_timeout(request),
        priority=admitted_priority(request),
        session=session_id(request),
    )
    if body.stream:
        return await event_stream(request, service.stream(prepared))
    return Response.model_validate(await until_disconnect(request, service.create(prepared)))


@generation.post("/v1/responses/input_tokens", response_model=InputTokens)
async def get_input_token_counts(body: InputTokensRequest, request: Request) -> Any:
    return await _service(request).input_tokens(body)


@stored.get("/v1/responses/{response_id}", response_model=Response)
async def get_response(response_id: str, request: Request) -> Any:
    return await _service(request).retrieve(response_id)


@stored.delete("/v1/responses/{response_id}", response_model=ResponseDeleted)
async def delete_response(response_id: str, request: Request) -> Any:
    return await _service(request).delete(response_id)


@stored.get("/v1/responses/{response_id}/input_items", response_model=ResponseItemList)
async def list_input_items(
    response_id: str,
    request: Request,
    limit: int = Query(default=20),
    order: Literal["asc", "desc"] = Query(default="desc"),
    after: str | None = Query(default=None),
) -> Any:
    return await _service(request).input_items(response_id, limit=limit, order=order, after=after)


# Generation routes take their JSON body through JsonBodyRoute (and are admitted); the stored
# responses' routes are plain GET/DELETE routes.
router = APIRouter()
router.include_router(generation)
router.include_router(stored)
