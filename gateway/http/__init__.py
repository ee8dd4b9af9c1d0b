"""HTTP plumbing every API uses (FastAPI/ASGI): the JSON-body route class and direct dispatch,
SSE responses and disconnects, middleware (keys, body size, admission, access log), typed services,
health and metrics endpoints."""
