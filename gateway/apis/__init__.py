"""The APIs the gateway speaks, one folder each over the shared core (`gateway.core`). Adding an
API is adding its folder (wire models, router, translation, stream writer) and one line here."""

from gateway.apis import chat_completions, completions, models, responses
from gateway.http.api import Api

APIS: tuple[Api, ...] = (completions.API, chat_completions.API, responses.API, models.API)
