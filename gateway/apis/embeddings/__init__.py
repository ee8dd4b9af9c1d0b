"""OpenAI embeddings (/v1/embeddings) over encoder models: wire models, router, translation."""

from gateway.apis.embeddings.router import router
from gateway.apis.embeddings.serving import EmbeddingsService
from gateway.http.api import Api

API = Api("embeddings", router, EmbeddingsService)
