"""POST /tokenize and /detokenize: get the service, answer."""

from __future__ import annotations

from fastapi import APIRouter, Request

from gateway.apis.openai.errors import ERROR_RESPONSES
from gateway.apis.tokenize.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from gateway.apis.tokenize.serving import TokenizeService
from gateway.http.services import service

# Not a generation route: no admission slot (JsonBodyRoute), FastAPI's own body parsing.
router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    return await service(request, TokenizeService).tokenize(body)


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    return await service(request, TokenizeService).detokenize(body)
