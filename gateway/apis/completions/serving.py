"""/v1/completions: prompts (text or token ids, one or many) -> choices, and back as a
text_completion or a chunk stream."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any, cast

from gateway import tracing
from gateway.apis.completions import logprobs as lp
from gateway.apis.completions.protocol import OPENAI_FIELDS, Completion, CompletionChoice, CompletionRequest
from gateway.apis.completions.stream import CompletionChunkWriter
from gateway.apis.openai.fields import check_stream_options, ignored_fields, note_ignored_fields
from gateway.apis.openai.protocol import CompletionUsage
from gateway.apis.openai.sse import DONE, error_event
from gateway.core import validation as v
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
from gateway.errors import InvalidRequestError, UnsupportedParameterError


class CompletionsService(GenerationService):
    async def prepare(
        self,
        body: CompletionRequest,
        *,
        timeout_s: float | None = None,
        session: str | None = None,
        priority: int = 0,
    ) -> tuple[PreparedRequest, list[str]]:
        """Everything that can fail before generation starts, so it fails with a proper status."""
        note_ignored_fields(ignored_fields(body, OPENAI_FIELDS, strict=self._limits.reject_unknown_fields))
        check_stream_options(body.stream, body.stream_options)
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        _reject_unsupported(body)
        n = v.choose_n(body.n, self._limits)
        stops = v.stop_strings(body.stop, self._limits)
        with tracing.span("tokenize", model=runtime.name):
            prompts = await _prompts(runtime, body, self._limits)
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
                    params=v.sampling_params(body, max_tokens),
                    num_sequences=n,
                    stops=stops,
                    first_index=i * n,
                    logprobs=logprobs,
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
        return prepared, echoes

    async def create(self, prepared: PreparedRequest, echoes: list[str]) -> Completion:
        n = len(prepared.generations[0].choices)
        texts = {i: echoes[i // n] for i in range(len(echoes) * n)}
        reasons: dict[int, str] = {}
        blocks = _logprob_blocks(prepared, echoes, n)
        entries: dict[int, list[dict[str, Any]]] = {i: [] for i in texts}
        async for event in events(prepared, self._metrics):
            texts[event.index] += event.text
            if event.finish_reason is not None:
                reasons[event.index] = event.finish_reason
            if blocks:
                entries[event.index].append(blocks[event.index].block(event.logprobs))
        choices = [
            CompletionChoice(
                index=i,
                text=texts[i],
                finish_reason=reasons[i],  # type: ignore[arg-type]
                logprobs=lp.merge_blocks(entries[i]) if blocks else None,
            )
            for i in sorted(texts)
        ]
        return Completion(
            id=prepared.response_id,
            created=prepared.created,
            model=prepared.runtime.name,
            choices=choices,
            usage=_usage(prepared),
        )

    async def stream(self, prepared: PreparedRequest, echoes: list[str]) -> AsyncGenerator[bytes, None]:
        writer = CompletionChunkWriter(
            prepared.response_id,
            prepared.created,
            prepared.runtime.name,
            include_usage=prepared.include_usage,
        )
        try:
            n = len(prepared.generations[0].choices)
            blocks = _logprob_blocks(prepared, echoes, n)
            for i, echo in enumerate(echoes):
                if echo:
                    for j in range(n):
                        yield writer.text(i * n + j, echo)
            async for event in events(prepared, self._metrics):
                if event.text or event.finish_reason is not None or event.logprobs:
                    logprobs = blocks[event.index].block(event.logprobs) if blocks else None
                    yield writer.text(event.index, event.text, event.finish_reason, logprobs)
            if prepared.include_usage:
                yield writer.usage(prepared.prompt_tokens, prepared.completion_tokens, prepared.cached_tokens)
        except Exception as exc:
            yield error_event(stream_failure(exc))
        yield DONE


def _reject_unsupported(request: CompletionRequest) -> None:
    """Fields that would change the result but are not served yet: a 400 naming them, never a
    silent default."""
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


def _usage(prepared: PreparedRequest) -> CompletionUsage:
    prompt, completion = prepared.prompt_tokens, prepared.completion_tokens
    return CompletionUsage.of(prompt, completion, prepared.cached_tokens)


async def _prompts(
    runtime: ModelRuntime, body: CompletionRequest, limits: v.RequestLimits
) -> list[tuple[str, Sequence[int] | None, int]]:
    """Each prompt's text, token ids (None: counted later, see prompt_budget) and max_tokens."""
    tok = runtime.tokenizer
    prompt = body.prompt
    if not prompt and not isinstance(prompt, str):
        raise InvalidRequestError("the prompt must not be empty", param="prompt")
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        texts = [prompt] if isinstance(prompt, str) else cast(list[str], prompt)
        out: list[tuple[str, Sequence[int] | None, int]] = []
        for text in texts:
            ids, max_tokens = await v.prompt_budget(
                runtime,
                raw_prompt(runtime, text),
                requested=body.max_tokens,
                param="max_tokens",
                prompt_param="prompt",
                limits=limits,
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
            body.max_tokens,
            len(ids),
            runtime.max_model_len,
            param="max_tokens",
            prompt_param="prompt",
            limits=limits,
        )
        out.append((tok.decode(ids, skip_special_tokens=False), list(ids), max_tokens))
    return out
