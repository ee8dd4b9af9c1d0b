"""/tokenize and /detokenize (vLLM's shapes): the ids the gateway sends for a prompt or a chat, and
the text of ids."""

from gateway.apis.tokenize.router import router
from gateway.apis.tokenize.serving import TokenizeService
from gateway.http.api import Api

API = Api("tokenize", router, TokenizeService)
