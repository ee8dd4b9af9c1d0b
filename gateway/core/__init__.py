"""OpenAI <-> engine translation and the streaming state machines. Knows nothing of FastAPI or Triton."""
