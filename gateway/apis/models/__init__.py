"""OpenAI models (/v1/models): the served models."""

from gateway.apis.models.router import router
from gateway.http.api import Api

API = Api("models", router)
