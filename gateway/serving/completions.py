"""/v1/completions: prompts (text or token ids, one or many) -> choices."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, cast

from gateway import tracing
from gateway.errors import InvalidRequestError
from gateway.protocol.openai import Completion, CompletionChoice, CompletionRequest, CompletionUsage
from gateway.serving import logprobs as lp
from gateway.serving import params as p
from gateway.serving.base import (
    GenerationService,
    PreparedRequest,
    build_generation,
    events,
    new_id,
    prompt_budget,
    stream_failure,
    token_options,
)
from gateway.serving.chunks import DONE, CompletionChunkWriter
from gateway.serving.registry import ModelRuntime


class CompletionService(GenerationService):
    async def prepare(
        self, body: CompletionRequest, *, timeout_s: float | None = None
    ) -> tuple[PreparedRequest, list[str]]:
        """Everything that can fail before generation starts, so it fails with a proper status."""
        runtime = self._registry.get(body.model)
        await runtime.engine.ensure_ready()
        p.log_unknown_fields(body.model_extra)
        p.reject_unsupported(body)
        n = p.choose_n(body.n, self._limits)
        stops = p.stop_strings(body.stop, self._limits)
        with tracing.span("tokenize", model=runtime.name):
            prompts = _prompts(runtime, body, self._limits)
        logprobs, bias = token_options(
            runtime,
            logprobs=body.logprobs is not None,
            top_logprobs=body.logprobs,
            top_param="logprobs",
            logit_bias=body.logit_bias,
        )
        response_id = new_id("cmpl")
        generations = []
        echoes = []
        for i, (text, ids, max_tokens) in enumerate(prompts):
            generations.append(
                build_generation(
                    runtime,
                    request_id=f"{response_id}-{i}",
                    prompt_text=text,
                    prompt_ids=ids,
                    params=p.sampling_params(body, max_tokens, n),
                    n=n,
                    stops=stops,
                    first_index=i * n,
                    logprobs=logprobs,
                    logit_bias=bias,
                    stream=bool(body.stream),
                )
            )
            echoes.append(text if body.echo else "")
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return PreparedRequest(
            runtime,
            generations,
            response_id,
            include_usage=include_usage,
            timeout_s=p.request_deadline(self._limits, timeout_s),
            logprobs=logprobs,
        ), echoes

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
        writer = CompletionChunkWriter(prepared.response_id, prepared.created, prepared.runtime.name)
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
                yield writer.usage(prepared.prompt_tokens, prepared.completion_tokens)
        except Exception as exc:
            yield stream_failure(exc)
        yield DONE


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
    return CompletionUsage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )


def _prompts(
    runtime: ModelRuntime, body: CompletionRequest, limits: p.RequestLimits
) -> list[tuple[str, list[int] | None, int]]:
    """Each prompt's text, token ids (None: counted later, see prompt_budget) and max_tokens."""
    tok = runtime.tokenizer
    prompt = body.prompt
    if not prompt and not isinstance(prompt, str):
        raise InvalidRequestError("the prompt must not be empty", param="prompt")
    if isinstance(prompt, str) or isinstance(prompt[0], str):
        texts = [prompt] if isinstance(prompt, str) else cast(list[str], prompt)
        out: list[tuple[str, list[int] | None, int]] = []
        for text in texts:
            ids, max_tokens = prompt_budget(
                runtime, text, requested=body.max_tokens, param="max_tokens", limits=limits
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
        max_tokens = p.resolve_max_tokens(
            body.max_tokens, len(ids), runtime.max_model_len, param="max_tokens", limits=limits
        )
        out.append((tok.decode(ids, skip_special_tokens=False), list(ids), max_tokens))
    return out
