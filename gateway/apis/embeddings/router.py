"""POST /v1/embeddings: get the service, answer."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.apis.embeddings.protocol import EmbeddingList, EmbeddingRequest
from gateway.apis.embeddings.serving import EmbeddingsService
from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.http.routing import JsonBodyRoute
from gateway.http.services import service
from gateway.http.streaming import session_id

# A JsonBodyRoute: admitted, rate-limited and counted as the generation routes are.
router = APIRouter(responses=ERROR_RESPONSES, route_class=JsonBodyRoute)


@router.post("/v1/embeddings", response_model=EmbeddingList)
async def create_embedding(body: EmbeddingRequest, request: Request) -> EmbeddingList:
    return await service(request, EmbeddingsService).create(body, session=session_id(request))
