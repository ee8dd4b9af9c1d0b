"""POST /v1/score (and vLLM's /score): get the service, answer."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.apis.score.protocol import ScoreRequest, ScoreResponse
from gateway.apis.score.serving import ScoreService
from gateway.http.routing import JsonBodyRoute
from gateway.http.services import service
from gateway.http.streaming import session_id

router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/score", response_model=ScoreResponse)
async def create_score(body: ScoreRequest, request: Request) -> ScoreResponse:
    return await service(request, ScoreService).create(body, session=session_id(request))


router.add_api_route(
    "/score", create_score, methods=["POST"], response_model=ScoreResponse, include_in_schema=False
)
