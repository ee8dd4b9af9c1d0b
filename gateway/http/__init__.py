"""Thin routers, one per OpenAI resource: resolve services from app.state, call the serving layer."""
