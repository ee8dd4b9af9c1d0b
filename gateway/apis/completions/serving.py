"""/v1/completions: prompts (text or token ids, one or many) -> choices, and back as a
text_completion or a chunk stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from gateway import tracing
from gateway.apis.completions import logprobs as lp
from gateway.apis.completions.protocol import OPENAI_FIELDS, Completion, CompletionChoice, CompletionRequest
from gateway.apis.completions.stream import CompletionChunkWriter
from gateway.apis.openai.fields import check_stream_options, ignored_fields, note_ignored_fields
from gateway.apis.openai.logprobs import ranked_prompt_logprobs
from gateway.apis.openai.protocol import CompletionUsage
from gateway.apis.openai.sse import DONE, error_event
from gateway.core import validation as v
from gateway.core.choices import ChoiceEvent
from gateway.core.generation import (
    GenerationService,
    PreparedRequest,
    affinity_key,
    build_generation,
    events,
    new_id,
    reserve_quota,
    stream_failure,
)
from gateway.core.models import ModelRuntime
from gateway.core.prompt import raw_prompt
from gateway.engine import TokenLogprob
from gateway.errors import EngineError, InvalidRequestError, UnsupportedParameterError


@dataclass(frozen=True, slots=True)
class EchoPlan:
    """What a completion adds around the generated text: each prompt's echoed text (empty
    without `echo`), whether the echo carries the prompt's log probabilities, vLLM's
    `prompt_logprobs`, and whether nothing is generated at all (`max_tokens: 0` with `echo`)."""

    echoes: list[str]
    echo_logprobs: bool = False
    prompt_logprobs: int | None = None
    scoring_only: bool = False

    @property
    def scores_prompt(self) -> bool:
        return self.echo_logprobs or self.prompt_logprobs is not None


class CompletionsService(GenerationService):
    async def prepare(
        self,
        body: CompletionRequest,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        priority: int = 0,
    ) -> tuple[PreparedRequest, EchoPlan]:
        """Everything that can fail before generation starts, so it fails with a proper status."""
        note_ignored_fields(ignored_fields(body, OPENAI_FIELDS, strict=self._limits.reject_unknown_fields))
        check_stream_options(body.stream, body.stream_options)
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        _reject_unsupported(body)
        n = v.choose_n(body.n, self._limits)
        stops = v.stop_strings(body.stop, self._limits)
        scoring_only = body.max_tokens == 0
        echo_logprobs = bool(body.echo) and body.logprobs is not None
        # As OpenAI's legacy API and vLLM: echo with logprobs scores the prompt too.
        prompt_top = v.prompt_scoring(
            runtime,
            _most(body.logprobs if echo_logprobs else None, body.prompt_logprobs),
            param="echo" if echo_logprobs else "prompt_logprobs",
        )
        with tracing.span("tokenize", model=runtime.name):
            prompts = await _prompts(runtime, body, self._limits, need_ids=prompt_top is not None)
        logprobs, bias = v.token_options(
            runtime,
            logprobs=body.logprobs is not None,
            top_logprobs=body.logprobs,
            top_param="logprobs",
            logit_bias=body.logit_bias,
        )
        response_id = new_id("cmpl")
        generations = []
        echoes = []
        affinity = affinity_key(
            prompt_cache_key=body.prompt_cache_key,
            session=session,
            safety_identifier=body.safety_identifier,
            user=body.user,
        )
        for i, (text, ids, max_tokens) in enumerate(prompts):
            generations.append(
                build_generation(
                    runtime,
                    request_id=f"{response_id}-{i}",
                    prompt=raw_prompt(runtime, text),
                    prompt_ids=ids,
                    # Scoring alone still runs one decoding step (an engine request generates at
                    # least one token); its output is dropped.
                    params=v.sampling_params(body, max(max_tokens, 1)),
                    num_sequences=n,
                    stops=stops,
                    first_index=i * n,
                    logprobs=logprobs,
                    prompt_logprobs=prompt_top,
                    logit_bias=bias,
                    affinity=affinity,
                    stream=bool(body.stream),
                    priority=priority,
                )
            )
            echoes.append(text if body.echo else "")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        prepared = PreparedRequest(
            runtime,
            generations,
            response_id,
            include_usage=include_usage,
            timeout_s=v.request_deadline(self._limits, timeout_s),
            client_deadline=v.client_chose_deadline(self._limits, timeout_s),
            logprobs=logprobs,
        )
        await reserve_quota(prepared)
        plan = EchoPlan(echoes, echo_logprobs, body.prompt_logprobs, scoring_only)
        return prepared, plan

    async def create(self, prepared: PreparedRequest, plan: EchoPlan) -> Completion:
        echoes = plan.echoes
        n = len(prepared.generations[0].choices)
        texts = {i: echoes[i // n] for i in range(len(echoes) * n)}
        reasons: dict[int, str] = {}
        blocks = _logprob_blocks(prepared, echoes, n)
        entries: dict[int, list[dict[str, Any]]] = {i: [] for i in texts}
        async for event in events(prepared, self._metrics):
            if event.finish_reason is not None:
                reasons[event.index] = event.finish_reason
            if plan.scoring_only:
                continue
            texts[event.index] += event.text
            if blocks:
                entries[event.index].append(blocks[event.index].block(event.logprobs))
        prompts = _prompt_entries(prepared, plan)
        choices = []
        for i in sorted(texts):
            logprobs = None
            if blocks:
                echoed = [_echo_block(prepared, plan, prompts[i // n], i // n)] if plan.echo_logprobs else []
                logprobs = lp.merge_blocks([*echoed, *entries[i]])
            choices.append(
                CompletionChoice(
                    index=i,
                    text=texts[i],
                    # Scoring alone stops at its length, as vLLM says of it.
                    finish_reason="length" if plan.scoring_only else reasons[i],  # type: ignore[arg-type]
                    logprobs=logprobs,
                    prompt_logprobs=None
                    if plan.prompt_logprobs is None
                    else ranked_prompt_logprobs(
                        prepared.runtime.tokenizer, prompts[i // n], plan.prompt_logprobs
                    ),
                )
            )
        return Completion(
            id=prepared.response_id,
            created=prepared.created,
            model=prepared.runtime.name,
            choices=choices,
            usage=_usage(prepared, plan),
        )

    async def stream(self, prepared: PreparedRequest, plan: EchoPlan) -> AsyncGenerator[bytes, None]:
        writer = CompletionChunkWriter(
            prepared.response_id,
            prepared.created,
            prepared.runtime.name,
            include_usage=prepared.include_usage,
        )
        echoes = plan.echoes
        try:
            n = len(prepared.generations[0].choices)
            blocks = _logprob_blocks(prepared, echoes, n)
            # An echo with the prompt's log probabilities waits for them, and its choice's events
            # wait behind it: they come with one engine response of that prompt, which need not
            # be the first to arrive (another prompt's, another sequence's may come before it).
            # A plain echo goes out at once.
            pending = {
                i * n + j for i, echo in enumerate(echoes) if echo or plan.echo_logprobs for j in range(n)
            }
            if not plan.echo_logprobs:
                for index in sorted(pending):
                    yield writer.text(index, echoes[index // n])
                pending.clear()
            held: dict[int, list[ChoiceEvent]] = {}

            def frame(event: ChoiceEvent) -> bytes | None:
                if plan.scoring_only:
                    if event.finish_reason is None:
                        return None
                    return writer.text(event.index, "", "length", None)
                if event.text or event.finish_reason is not None or event.logprobs:
                    logprobs = blocks[event.index].block(event.logprobs) if blocks else None
                    return writer.text(event.index, event.text, event.finish_reason, logprobs)
                return None

            def echoed(*, last: bool) -> Iterator[bytes]:
                """The echoes whose prompts are scored by now (at the end: all of them, or the
                engine's failure to score one), each followed by its choice's held events."""
                for index in sorted(pending):
                    prompt = index // n
                    entries = prepared.generations[prompt].totals.prompt_logprobs
                    if entries is None and not last:
                        continue
                    if entries is None:
                        raise EngineError("the engine returned no log probabilities for the prompt")
                    pending.discard(index)
                    block = _echo_block(prepared, plan, entries, prompt)
                    yield writer.text(index, echoes[prompt], None, block)
                    for event in held.pop(index, ()):
                        if (out := frame(event)) is not None:
                            yield out

            async for event in events(prepared, self._metrics):
                if event.index in pending:
                    held.setdefault(event.index, []).append(event)
                elif (out := frame(event)) is not None:
                    yield out
                if pending:
                    for out in echoed(last=False):
                        yield out
            for out in echoed(last=True):
                yield out
            if prepared.include_usage:
                completion = 0 if plan.scoring_only else prepared.completion_tokens
                yield writer.usage(prepared.prompt_tokens, completion, prepared.cached_tokens)
        except Exception as exc:
            yield error_event(stream_failure(exc))
        yield DONE


def _most(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _prompt_entries(prepared: PreparedRequest, plan: EchoPlan) -> list[tuple[TokenLogprob | None, ...]]:
    """Each prompt's log probabilities as the engine returned them (first token None)."""
    if not plan.scores_prompt:
        return []
    out = []
    for generation in prepared.generations:
        entries = generation.totals.prompt_logprobs
        if entries is None:
            raise EngineError("the engine returned no log probabilities for the prompt")
        out.append(entries)
    return out


def _echo_block(
    prepared: PreparedRequest, plan: EchoPlan, entries: Sequence[TokenLogprob | None], prompt: int
) -> dict[str, Any]:
    """The echoed prompt's part of a choice's logprobs: its tokens from the first, the first
    with no log probability (nothing comes before it)."""
    top = prepared.logprobs
    block = lp.CompletionLogprobs(prepared.runtime.tokenizer, start=0, with_top=bool(top))
    ids = prepared.generations[prompt].request.prompt_ids
    return block.prompt_block(ids, entries, top or 0, plan.echoes[prompt])


def _reject_unsupported(request: CompletionRequest) -> None:
    """Fields that would change the result but are not served yet: a 400 naming them, never a
    silent default."""
    if request.max_tokens == 0 and not request.echo:
        raise InvalidRequestError(
            "max_tokens 0 scores the prompt without generating, which needs echo", param="max_tokens"
        )
    if request.prompt_logprobs is not None and request.stream:
        raise InvalidRequestError(
            "prompt_logprobs is not available when stream is true", param="prompt_logprobs"
        )
    checks = [
        ("best_of", request.best_of is not None and request.best_of != (request.n or 1)),
        ("suffix", bool(request.suffix)),
    ]
    for name, present in checks:
        if present:
            raise UnsupportedParameterError(f"`{name}` is not supported by this server yet", param=name)


def _logprob_blocks(prepared: PreparedRequest, echoes: list[str], n: int) -> dict[int, lp.CompletionLogprobs]:
    if prepared.logprobs is None:
        return {}
    tokenizer = prepared.runtime.tokenizer
    return {
        i * n + j: lp.CompletionLogprobs(tokenizer, start=len(echo), with_top=prepared.logprobs > 0)
        for i, echo in enumerate(echoes)
        for j in range(n)
    }


def _usage(prepared: PreparedRequest, plan: EchoPlan) -> CompletionUsage:
    # Scoring alone returns no generated token, so it counts none.
    prompt, completion = prepared.prompt_tokens, 0 if plan.scoring_only else prepared.completion_tokens
    return CompletionUsage.of(prompt, completion, prepared.cached_tokens)


async def _prompts(
    runtime: ModelRuntime, body: CompletionRequest, limits: v.RequestLimits, *, need_ids: bool = False
) -> list[tuple[str, Sequence[int] | None, int]]:
    """Each prompt's text, token ids (None: counted later, see prompt_budget) and max_tokens."""
    tok = runtime.tokenizer
    prompt = body.prompt
    # Scoring alone (max_tokens 0) still needs room for the one step the engine runs.
    requested = 1 if body.max_tokens == 0 else body.max_tokens
    if not prompt and not isinstance(prompt, str):
        raise InvalidRequestError("the prompt must not be empty", param="prompt")
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        texts = [prompt] if isinstance(prompt, str) else cast(list[str], prompt)
        out: list[tuple[str, Sequence[int] | None, int]] = []
        for text in texts:
            ids, max_tokens = await v.prompt_budget(
                runtime,
                raw_prompt(runtime, text),
                requested=requested,
                param="max_tokens",
                prompt_param="prompt",
                limits=limits,
                need_ids=need_ids,
            )
            out.append((text, ids, max_tokens))
        return out
    id_lists = [cast(list[int], prompt)] if isinstance(prompt[0], int) else cast(list[list[int]], prompt)
    out = []
    for ids in id_lists:
        bad = next((t for t in ids if not 0 <= t < tok.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} is outside the vocabulary", param="prompt")
        # The ensemble tokenizes text itself; ids it is given are sent as their text.
        max_tokens = v.resolve_max_tokens(
            requested,
            len(ids),
            runtime.max_model_len,
            param="max_tokens",
            prompt_param="prompt",
            limits=limits,
        )
        out.append((tok.decode(ids, skip_special_tokens=False), list(ids), max_tokens))
    return out
