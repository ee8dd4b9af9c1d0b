"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over the core."""
