"""OpenAI chat completions (/v1/chat/completions): wire models, router, translation, stream writer."""

from gateway.apis.chat_completions.router import router
from gateway.apis.chat_completions.serving import ChatCompletionsService
from gateway.http.api import Api

API = Api("chat_completions", router, ChatCompletionsService)
