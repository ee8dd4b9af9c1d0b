"""Pydantic wire models of the OpenAI API: requests, responses, stream chunks, errors. No I/O."""
