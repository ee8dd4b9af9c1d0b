"""POST /v1/rerank (and vLLM's /rerank and /v2/rerank): get the service, answer."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.apis.rerank.protocol import RerankRequest, RerankResponse
from gateway.apis.rerank.serving import RerankService
from gateway.http.routing import JsonBodyRoute
from gateway.http.services import service
from gateway.http.streaming import session_id

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/rerank", response_model=RerankResponse)
async def create_rerank(body: RerankRequest, request: Request) -> RerankResponse:
    return await service(request, RerankService).create(body, session=session_id(request))


for _path in ("/rerank", "/v2/rerank"):
    router.add_api_route(
        _path, create_rerank, methods=["POST"], response_model=RerankResponse, include_in_schema=False
    )
