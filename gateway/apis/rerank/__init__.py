"""Rerank (/v1/rerank, and /rerank and /v2/rerank as vLLM serves them): Cohere's and Jina's shape
over cross-encoder models."""

from gateway.apis.rerank.router import router
from gateway.apis.rerank.serving import RerankService
from gateway.http.api import Api

API = Api("rerank", router, RerankService)
