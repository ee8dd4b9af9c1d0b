"""The generation core every API stands on: request validation and budgeting, building engine
requests, the per-choice streaming state machine, the served models. API-neutral; knows nothing
of FastAPI or Triton (the import contracts in pyproject.toml say so)."""
