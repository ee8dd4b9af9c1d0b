"""OpenAI's Responses API (/v1/responses): wire models, input translation, sealed reasoning, the
stream event builder, the router and the service over the core."""

from gateway.apis.responses.router import router
from gateway.apis.responses.serving import ResponsesService
from gateway.http.api import Api

API = Api("responses", router, ResponsesService)
