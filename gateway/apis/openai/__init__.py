"""What the OpenAI APIs share (not an API itself): common wire fields, the error mapping, SSE framing,
token strings for log probabilities."""
