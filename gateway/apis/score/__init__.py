"""Score (/v1/score and /score, vLLM's shape): relevance of text pairs over cross-encoder models."""

from gateway.apis.score.router import router
from gateway.apis.score.serving import ScoreService
from gateway.http.api import Api

API = Api("score", router, ScoreService)
