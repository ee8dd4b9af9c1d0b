"""The streaming state machine: engine deltas in, per-choice text and finish reasons out.

Pure apart from iterating the engine: no HTTP, no Triton. Feeding the same tokens split in any
way gives the same text, because decoding and stop matching both hold back what is not final.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

from gateway.asyncutil import merge as merge
from gateway.engine import Engine, GenerationDelta, GenerationRequest, TokenLogprob
from gateway.text.detokenizer import TextDecoder, Utf8TextAssembler, ids_decoder
from gateway.text.stop import StopStringMatcher
from gateway.text.tokenizer import Tokenizer


# Not frozen: one per streamed token (see GenerationDelta).
@dataclass(slots=True)
class ChoiceEvent:
    index: int
    text: str
    finish_reason: str | None = None
    # Log probabilities of the tokens behind this event's text (when asked for).
    logprobs: tuple[TokenLogprob, ...] = ()
    # The generated ids since the last event, end ids left out (only for choices made with
    # `keep_ids`: a reasoning parser counts the thinking's tokens from them).
    token_ids: Sequence[int] = ()


class ChoiceState:
    """One choice (one generated sequence): decoding, stop strings, token count, finish reason."""

    __slots__ = (
        "_count_text",
        "_decoder",
        "_end_ids",
        "_engine_finish",
        "_ids",
        "_keep_ids",
        "_logprobs",
        "_logprobs_started",
        "_stop",
        "_text",
        "completion_tokens",
        "finish_reason",
        "index",
        "max_tokens",
    )

    def __init__(
        self,
        index: int,
        decoder: TextDecoder,
        *,
        stops: Sequence[str],
        end_ids: frozenset[int],
        max_tokens: int,
        keep_ids: bool = False,
        count_text: Callable[[str], int] | None = None,
    ) -> None:
        """`count_text`: the engine reports no token counts; completion tokens are the count of
        the text it generated (up to where it stopped), encoded again."""
        self.index = index
        self._decoder = decoder
        self._stop = StopStringMatcher(stops)
        self._end_ids = end_ids
        self.max_tokens = max_tokens
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self._logprobs: list[TokenLogprob] = []
        self._logprobs_started = False
        self._keep_ids = keep_ids
        self._ids: list[int] = []
        self._count_text = count_text
        self._text: list[str] = []
        self._engine_finish: str | None = None

    def take_ids(self) -> Sequence[int]:
        """The generated ids since the last event (none unless made with `keep_ids`)."""
        if not self._ids:
            return ()
        out, self._ids = self._ids, []
        return out

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """Log probabilities gathered since the last event; text held back keeps them waiting."""
        if not self._logprobs:
            return ()
        out, self._logprobs = tuple(self._logprobs), []
        return out

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended this choice, if one did."""
        return self._stop.matched

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def feed(self, delta: GenerationDelta) -> str:
        if self.finish_reason is not None:
            return ""
        ended = False
        if delta.token_ids is not None:
            ids = delta.token_ids
            if self._end_ids:
                for pos, token in enumerate(ids):
                    if token in self._end_ids:
                        # The end token counts as generated (as in vLLM) but is never text.
                        ids, ended = ids[:pos], True
                        self.completion_tokens += pos + 1
                        break
            if not ended:
                self.completion_tokens += len(ids)
            if delta.logprobs:
                # End tokens are never text, so they get no entry either.
                entries = delta.logprobs[: len(ids)]
                if entries and not self._logprobs_started:
                    self._logprobs_started = True
                    entries = (replace(entries[0], starts_text=True), *entries[1:])
                self._logprobs.extend(entries)
            if self._keep_ids:
                self._ids.extend(ids)
            text = self._decoder.push_ids(ids)
        else:
            self.completion_tokens += delta.num_tokens
            text = self._decoder.push_bytes(delta.text or b"")
            if delta.finish_reason is not None:
                self._engine_finish = delta.finish_reason
            if self._count_text is not None:
                self._text.append(text)
        out = self._stop.push(text)
        if self._stop.stopped:
            self._recount()
            self.finish_reason = "stop"
        elif ended:
            out += self._drain()
            self.finish_reason = "stop"
        return out

    def finish(self) -> str:
        """The engine ended this sequence without a stop: release held text, decide the reason."""
        if self.finish_reason is not None:
            return ""
        if self._count_text is not None:
            # The decoder's last bytes are generated text too.
            tail = self._decoder.flush()
            self._text.append(tail)
            out = self._stop.push(tail) + self._stop.flush()
            self._recount()
        else:
            out = self._drain()
        if self._stop.stopped:
            self.finish_reason = "stop"
        elif self._engine_finish in ("stop", "length"):
            # The engine knows; a count of re-encoded text may differ from its own.
            self.finish_reason = self._engine_finish
            if self._engine_finish == "length":
                # Then it generated exactly max_tokens: a count, not an estimate.
                self.completion_tokens = self.max_tokens
        else:
            self.finish_reason = "length" if self.completion_tokens >= self.max_tokens else "stop"
        return out

    def _recount(self) -> None:
        if self._count_text is not None:
            # Text encoded again may take more tokens than were generated, never more than allowed.
            self.completion_tokens = min(self._count_text("".join(self._text)), self.max_tokens)

    def _drain(self) -> str:
        out = self._stop.push(self._decoder.flush())
        return out + self._stop.flush()


def make_choices(
    tokenizer: Tokenizer,
    request: GenerationRequest,
    *,
    token_ids: bool,
    first_index: int,
    stops: Sequence[str],
    text_prefix: str = "",
    skip_special_tokens: bool = True,
    keep_ids: bool = False,
    count_text: Callable[[str], int] | None = None,
) -> list[ChoiceState]:
    """The choices of one engine request. `skip_special_tokens` False keeps special tokens in the
    text (a reasoning format whose markers are special tokens); `keep_ids` hands each event its ids."""
    end_ids = frozenset(request.end_token_ids) if not request.params.ignore_eos else frozenset()
    if request.end_id is not None and not request.params.ignore_eos:
        end_ids |= {request.end_id}
    factory: Callable[[], TextDecoder]
    if token_ids:

        def factory() -> TextDecoder:
            return ids_decoder(tokenizer, skip_special_tokens=skip_special_tokens)
    else:

        def factory() -> TextDecoder:
            return Utf8TextAssembler(strip_prefix=text_prefix.encode())

    return [
        ChoiceState(
            first_index + i,
            factory(),
            stops=stops,
            end_ids=end_ids,
            max_tokens=request.params.max_tokens,
            keep_ids=keep_ids,
            count_text=count_text,
        )
        for i in range(request.num_sequences)
    ]


@dataclass(slots=True)
class GenerationTotals:
    # None until known: the engine reports it, or the gateway counts it (base.Generation).
    prompt_tokens: int | None
    # Every choice finished (stop string, end id) before the engine did: its request was cancelled.
    stopped_early: bool = False
    # Prompt tokens the engine took from its KV cache (None: it does not say). With several
    # engine requests for one prompt (n without native sequences), the fewest any of them reused.
    cached_tokens: int | None = None
    # The prompt's log probabilities (the first None), when asked for and the engine has sent them.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


async def run_generation(
    engine: Engine, request: GenerationRequest, choices: list[ChoiceState], totals: GenerationTotals
) -> AsyncIterator[ChoiceEvent]:
    """Drive one engine request. Stops (and so cancels the engine request) once every choice is
    done, e.g. all hit a stop string."""
    stream = engine.generate(request)
    try:
        async for delta in stream:
            if delta.num_input_tokens is not None:
                totals.prompt_tokens = delta.num_input_tokens
            if delta.cached_tokens is not None and (
                totals.cached_tokens is None or delta.cached_tokens < totals.cached_tokens
            ):
                totals.cached_tokens = delta.cached_tokens
            if delta.prompt_logprobs is not None:
                totals.prompt_logprobs = delta.prompt_logprobs
            choice = choices[delta.index]
            text = choice.feed(delta)
            if text or choice.done:
                yield ChoiceEvent(
                    choice.index, text, choice.finish_reason, choice.take_logprobs(), choice.take_ids()
                )
                if choice.done and all(c.done for c in choices):
                    totals.stopped_early = True
                    break
    finally:
        # Closing the engine's iterator is what cancels the Triton request.
        await stream.aclose()  # type: ignore[attr-defined]
    for choice in choices:
        if not choice.done:
            text = choice.finish()
            yield ChoiceEvent(
                choice.index, text, choice.finish_reason, choice.take_logprobs(), choice.take_ids()
            )
