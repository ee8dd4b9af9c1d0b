"""A scripted engine for API tests: deterministic output, both token-id and text-bytes modes,
and a record of which requests were cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.engine import EngineInfo, GenerationDelta, GenerationRequest, TokenLogprob
from gateway.errors import EngineError, EngineUnavailableError
from gateway.text.tokenizer import Tokenizer

# FakeEngine's settings for an engine like TensorRT-LLM's llmapi model: text only (no token ids),
# no guided decoding, log probabilities or logit bias, BOS added by the model, usage counted from
# the text, few sampling parameters.
LLMAPI_LIKE: dict[str, Any] = {
    "token_ids": False,
    "guided": False,
    "logprobs": False,
    "logit_bias": False,
    "adds_special_tokens": True,
    "counts_text": True,
    "sampling": frozenset({"max_tokens", "temperature", "top_p", "top_k", "seed"}),
}


@dataclass
class FakeEngine:
    tokenizer: Tokenizer
    reply: Callable[[GenerationRequest, int], str] = lambda req, i: "Hello there! 你好 🎉 how are you today?"
    token_ids: bool = True
    ready: bool = True
    guided: bool = True
    # Whether the engine reports log probabilities (and alternatives); they are scripted values.
    logprobs: bool = True
    # Whether it scores the prompt (scripted values, see scripted_prompt_logprobs).
    prompt_logprobs: bool = True
    # The prompt's log probabilities come on a request's last delta, not its first (as where
    # another sequence's response, or another of n requests, arrives before the one that has them).
    prompt_logprobs_last: bool = False
    logit_bias: bool = True
    # Whether requests may carry a LoRA adapter.
    lora: bool = True
    # It never looks at the prompt's ids: requests may go out before the prompt is tokenized.
    needs_prompt_ids: bool = False
    # How requests reach the model, as the Triton adapter names it ("engine": the gateway's ids;
    # anything else: text the model's own preprocessing encodes).
    route: str = ""
    # Prompt tokens the engine says it reused from its KV cache (None: it does not report any).
    cached_tokens: int | None = None
    # Like the llmapi model: it tokenizes text itself adding special tokens, reports no token
    # counts, takes only these sampling parameters (None: all).
    adds_special_tokens: bool = False
    counts_text: bool = False
    sampling: frozenset[str] | None = None
    # Whether it takes images (GenerationRequest.images).
    images: bool = False
    # Fail after this many deltas (None: never), with this error.
    fail_after: int | None = None
    fail_with: type[Exception] = EngineError
    # Wait on this event before each delta (tests pace the stream with it).
    gate: asyncio.Event | None = None
    requests: list[GenerationRequest] = field(default_factory=list)
    # Set when a request reaches the engine.
    started: asyncio.Event = field(default_factory=asyncio.Event)
    active: set[str] = field(default_factory=set)
    cancelled: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)

    @property
    def info(self) -> EngineInfo:
        if not self.ready:
            raise EngineUnavailableError("fake engine is not ready")
        return EngineInfo(
            model="fake",
            exposes_token_ids=self.token_ids,
            native_num_sequences=True,
            reports_token_counts=False,
            variant="current",
            guided_decoding=self.guided,
            logprobs=self.logprobs,
            top_logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            logit_bias=self.logit_bias,
            needs_prompt_ids=self.needs_prompt_ids,
            cached_tokens=self.cached_tokens is not None,
            lora=self.lora,
            adds_special_tokens=self.adds_special_tokens,
            counts_text=self.counts_text,
            sampling=self.sampling,
            route=self.route,
            images=self.images,
        )

    def output_ids(self, request: GenerationRequest, index: int) -> list[int]:
        ids = self.tokenizer.encode(self.reply(request, index), add_special_tokens=False)
        limit = request.params.max_tokens
        if request.params.ignore_eos or len(ids) >= limit:
            return ids[:limit] if len(ids) >= limit else (ids * (limit // max(len(ids), 1) + 1))[:limit]
        return ids

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        self.requests.append(request)
        self.active.add(request.request_id)
        self.started.set()
        sent = 0
        finished = False
        prompt = None
        if request.prompt_logprobs is not None:
            prompt = scripted_prompt_logprobs(request.prompt_ids, request.prompt_logprobs)
        try:
            sequences = [self.output_ids(request, i) for i in range(request.num_sequences)]
            longest = max(len(s) for s in sequences)
            deltas = sum(len(s) for s in sequences)
            for step in range(longest):
                for index, ids in enumerate(sequences):
                    if step >= len(ids):
                        continue
                    if self.gate is not None:
                        await self.gate.wait()
                    else:
                        await asyncio.sleep(0)
                    if self.fail_after is not None and sent >= self.fail_after:
                        raise self.fail_with("scripted engine failure")
                    sent += 1
                    token = ids[step]
                    # Like TensorRT-LLM's perf metrics: every response of a sequence carries it.
                    cached = self.cached_tokens
                    if self.token_ids:
                        lps = None
                        if request.logprobs is not None:
                            lps = (scripted_logprob(token, step, request.logprobs),)
                        yield GenerationDelta(
                            index=index,
                            token_ids=(token,),
                            num_tokens=1,
                            logprobs=lps,
                            cached_tokens=cached,
                            prompt_logprobs=None if self.prompt_logprobs_last and sent < deltas else prompt,
                        )
                        if not self.prompt_logprobs_last:
                            prompt = None
                    else:
                        yield GenerationDelta(
                            index=index, text=self._token_bytes(token), num_tokens=1, cached_tokens=cached
                        )
            finished = True
        finally:
            self.active.discard(request.request_id)
            (self.completed if finished else self.cancelled).append(request.request_id)

    def _token_bytes(self, token: int) -> bytes:
        # What our postprocessing emits: the token's own bytes (byte-level BPE here).
        (piece,) = self.tokenizer.convert_ids_to_tokens([token])
        return bytes(_BYTE_DECODER[ch] for ch in piece)

    async def is_ready(self) -> bool:
        return self.ready

    async def ensure_ready(self) -> None:
        if not self.ready:
            raise EngineUnavailableError("fake engine is not ready")

    async def close(self) -> None:
        return None


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte <-> printable character table.
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


_BYTE_DECODER = {v: k for k, v in _bytes_to_unicode().items()}


def scripted_logprob(token: int, step: int, top: int) -> TokenLogprob:
    """Log probability -0.1 * (step + 1) for the chosen token; alternatives are the chosen token and
    the ids after it, each 1.0 less likely than the one before."""
    chosen = -0.1 * (step + 1)
    alternatives = tuple((token + k, chosen - k) for k in range(top))
    return TokenLogprob(token, chosen, alternatives)


def scripted_prompt_logprobs(prompt: tuple[int, ...], top: int) -> tuple[TokenLogprob | None, ...]:
    """The first prompt token None; token i's log probability -0.5 * i, ranked i, with the
    alternatives from id 0 up, each 0.25 less likely than the one before (from -0.25)."""
    out: list[TokenLogprob | None] = [None]
    for pos, token in enumerate(prompt[1:], start=1):
        alternatives = tuple((k, -0.25 * (k + 1)) for k in range(top))
        out.append(TokenLogprob(token, -0.5 * pos, alternatives, rank=pos))
    return tuple(out)
