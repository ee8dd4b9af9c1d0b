"""Health, readiness and metrics endpoints (outside any API, open to probes)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.core.readiness import Readiness
from gateway.http.services import service
from gateway.metrics import GatewayMetrics

router = APIRouter()


@router.get("/health", include_in_schema=False)
async def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/health/ready", include_in_schema=False)
async def ready(request: Request) -> JSONResponse:
    models = await service(request, Readiness).check()
    ok = bool(models) and all(models.values())
    return JSONResponse(
        {"status": "ready" if ok else "unavailable", "models": models}, status_code=200 if ok else 503
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(service(request, GatewayMetrics).exposition(), media_type=CONTENT_TYPE_LATEST)
