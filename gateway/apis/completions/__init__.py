"""OpenAI (legacy) completions (/v1/completions): wire models, router, translation, stream writer."""

from gateway.apis.completions.router import router
from gateway.apis.completions.serving import CompletionsService
from gateway.http.api import Api

API = Api("completions", router, CompletionsService)
