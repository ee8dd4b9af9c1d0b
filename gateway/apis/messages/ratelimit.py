"""Anthropic's rate-limit headers (`anthropic-ratelimit-*`), which its SDKs and Claude Code read in
place of OpenAI's `x-ratelimit-*`: the same buckets, with resets as RFC 3339 instants rather than
durations. The gateway's token limit counts input and output together, which is Anthropic's
`tokens` family (the most restrictive of its limits); it has no separate input/output limits, so
their families are not sent."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from gateway.ratelimit import Decision, Limits, retry_after


def anthropic_headers(limits: Limits, decision: Decision, now: float | None = None) -> dict[str, str]:
    now = time.time() if now is None else now
    out: dict[str, str] = {}
    if limits.requests_per_minute is not None:
        out["anthropic-ratelimit-requests-limit"] = str(limits.requests_per_minute)
        out["anthropic-ratelimit-requests-remaining"] = str(max(0, decision.remaining_requests))
        out["anthropic-ratelimit-requests-reset"] = _instant(now + decision.reset_requests_s)
    if limits.tokens_per_minute is not None:
        out["anthropic-ratelimit-tokens-limit"] = str(limits.tokens_per_minute)
        out["anthropic-ratelimit-tokens-remaining"] = str(max(0, decision.remaining_tokens))
        out["anthropic-ratelimit-tokens-reset"] = _instant(now + decision.reset_tokens_s)
    out.update(retry_after(decision))
    return out


def _instant(epoch_s: float) -> str:
    # Whole seconds, rounded up: a client that waits until then finds the bucket full.
    return datetime.fromtimestamp(int(-(-epoch_s // 1)), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
