"""What the embeddings, rerank and score APIs share: an encoder model's runtime (tokenizer, Encoder,
what its files say about pooling or scoring), and the one path from inputs to vectors or scores:
tokenizing, limits, truncation, batching through the Encoder, pooling, normalizing, dimensions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from gateway.config import ServedModel
from gateway.core.generation import GenerationService
from gateway.core.models import EncoderRuntime
from gateway.core.pooling import (
    Classifier,
    Pooling,
    normalized,
    pool,
    read_classifier,
    read_pooling,
    relevance,
)
from gateway.encoder import Encoder, EncoderInput
from gateway.errors import ContextLengthExceededError, InvalidRequestError, ServerConfigError
from gateway.logs import current_request
from gateway.ratelimit import current_quota
from gateway.text.encoding import INLINE_CHARS
from gateway.text.tokenizer import Tokenizer

# OpenAI's bounds on one embeddings request: inputs per request, tokens over all of them.
MAX_INPUTS = 2048
MAX_REQUEST_TOKENS = 300_000

# An input: its text, or its token ids (without the special tokens the tokenizer adds to text).
Text = str | Sequence[int]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Encoded:
    vectors: list[np.ndarray]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Scored:
    scores: list[float]
    prompt_tokens: int


def check_serves(runtime: EncoderRuntime) -> None:
    """A start-up (and request-time) check that the gateway can turn this model's output into the
    task's answer; ServerConfigError saying why not."""
    info = runtime.encoder.info
    if runtime.task == "embed" and info.returns == "tokens":
        pooling = runtime.pooling
        if pooling is not None and pooling.unapplied:
            raise ServerConfigError(
                f"model {runtime.name!r} returns per-token states, but its sentence-transformers "
                f"modules after pooling ({', '.join(pooling.unapplied)}) are not applied by the gateway: "
                "export the model with its pooled embedding as an output"
            )
    if runtime.task == "score" and info.returns != "pooled":
        raise ServerConfigError(
            f"model {runtime.name!r} returns per-token states; a cross-encoder must return its logits "
            "([batch, labels])"
        )


def encoder_runtime(model: ServedModel, tokenizer: Tokenizer, encoder: Encoder, task: str) -> EncoderRuntime:
    """An encoder model's runtime, with what its files say about pooling or scoring (a
    ServerConfigError for files the gateway cannot follow)."""
    directory = Path(model.tokenizer)
    return EncoderRuntime(
        model,
        tokenizer,
        encoder,
        int(time.time()),
        task,
        pooling=read_pooling(directory) if task == "embed" else None,
        classifier=read_classifier(directory) if task == "score" else None,
    )


def describe_encoder(runtime: EncoderRuntime) -> str:
    """What the gateway serves of an encoder model, in one line (the start-up log, `gateway check`)."""
    info = runtime.encoder.info
    takes = "text in" if info.takes == "text" else "token ids in"
    if runtime.task == "score":
        what = f"cross-encoder for /v1/rerank and /v1/score ({takes}, {info.output_name} out"
    else:
        pooling = runtime.pooling or Pooling()
        if info.returns == "tokens":
            out = f"per-token {info.output_name} out, pooled in the gateway ({'+'.join(pooling.modes)})"
        else:
            out = f"pooled {info.output_name} out"
        dims = f"{info.width} dimensions" if info.width else "its own dimensions"
        if pooling.matryoshka:
            dims += f", Matryoshka {', '.join(map(str, pooling.matryoshka))}"
        norm = ", normalized" if pooling.normalize else ""
        what = f"embedding model for /v1/embeddings ({takes}, {out}{norm}; {dims}"
    limit = runtime.max_length
    return f"{what}; batches of {info.max_batch_size}; inputs up to {limit or 'any number of'} tokens)"


class EncoderService(GenerationService):
    """Base of the encoder APIs' services (over the same registry, limits and metrics)."""

    async def _runtime(self, model: str, task: str) -> EncoderRuntime:
        runtime = self._registry.encoder(model, task)
        await runtime.encoder.ensure_ready()
        check_serves(runtime)
        return runtime

    def _ids(
        self,
        runtime: EncoderRuntime,
        value: Text,
        param: str,
        truncate: int | None,
        add_special_tokens: bool = True,
    ) -> list[int]:
        """An input's ids: a text's as the tokenizer encodes it (cut as it truncates, keeping its
        special tokens, when the client asks), token ids checked against the vocabulary."""
        tokenizer = runtime.tokenizer
        if isinstance(value, str):
            if not value:
                raise InvalidRequestError("an input cannot be an empty string", param=param)
            keep = _keep(runtime, truncate)
            return tokenizer.encode_pair(value, max_length=keep, add_special_tokens=add_special_tokens)[0]
        ids = list(value)
        if not ids:
            raise InvalidRequestError("an input cannot be an empty list of token ids", param=param)
        bad = next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} is outside the model's vocabulary (0 to {tokenizer.vocab_size - 1})",
                param=param,
            )
        return ids

    def _fit(self, runtime: EncoderRuntime, ids: list[int], param: str, truncate: int | None) -> list[int]:
        """The input cut to `truncate` tokens (its last ones, as vLLM's truncate_prompt_tokens; -1:
        the model's limit), or a 400 when it is longer than the model takes."""
        limit = runtime.max_length
        keep = _keep(runtime, truncate)
        if keep is not None and len(ids) > keep:
            ids = ids[len(ids) - keep :]
        if limit is not None and len(ids) > limit:
            raise ContextLengthExceededError(
                f"an input is {len(ids)} tokens long, more than this model's limit of {limit} tokens; "
                "shorten it, or set truncate_prompt_tokens to cut it",
                param=param,
                code="context_length_exceeded",
            )
        return ids

    async def _reserve(self, runtime: EncoderRuntime, tokens: int) -> None:
        if tokens > MAX_REQUEST_TOKENS:
            raise InvalidRequestError(
                f"the inputs are {tokens} tokens in all, more than the {MAX_REQUEST_TOKENS} one request "
                "may have",
                param="input",
            )
        quota = current_quota.get()
        if quota is not None:
            await quota.reserve(tokens)

    def _done(self, runtime: EncoderRuntime, tokens: int, start: float) -> None:
        record = current_request.get()
        if record is not None:
            record.model = runtime.name
            record.prompt_tokens = tokens
            record.completion_tokens = 0
        if self._metrics is not None:
            series = self._metrics.model(runtime.name)
            series.prompt_tokens.inc(tokens)
            series.e2e.observe(time.perf_counter() - start)

    def _embed_inputs(
        self, runtime: EncoderRuntime, inputs: Sequence[Text], truncate: int | None, add_special_tokens: bool
    ) -> tuple[list[EncoderInput], int]:
        """Each input as the model takes it, checked against its limits, and their tokens."""
        texts = runtime.encoder.info.takes == "text"
        batch: list[EncoderInput] = []
        tokens = 0
        for i, value in enumerate(inputs):
            param = f"input[{i}]" if len(inputs) > 1 else "input"
            ids = self._ids(runtime, value, param, truncate, add_special_tokens)
            ids = self._fit(runtime, ids, param, truncate)
            tokens += len(ids)
            text = None
            if texts:
                # A text-in model tokenizes itself: it gets the text (token ids as their text).
                cut = truncate is not None or not isinstance(value, str)
                text = runtime.tokenizer.decode(ids, skip_special_tokens=True) if cut else str(value)
            batch.append(EncoderInput(ids=tuple(ids), text=text))
        return batch, tokens

    async def embed(
        self,
        model: str,
        inputs: Sequence[Text],
        *,
        dimensions: int | None = None,
        truncate: int | None = None,
        normalize: bool | None = None,
        affinity: str | None = None,
        add_special_tokens: bool = True,
    ) -> Encoded:
        """`add_special_tokens` (vLLM's): whether a text gets the tokenizer's special tokens."""
        start = time.perf_counter()
        runtime = await self._runtime(model, "embed")
        _count(inputs, "input")
        if not add_special_tokens and runtime.encoder.info.takes == "text":
            raise InvalidRequestError(
                f"model {runtime.name!r} takes text and tokenizes it itself, so add_special_tokens "
                "cannot be false for it",
                param="add_special_tokens",
            )
        batch, tokens = await _tokenized(
            runtime.tokenizer,
            sum(map(len, inputs)),
            lambda: self._embed_inputs(runtime, inputs, truncate, add_special_tokens),
        )
        await self._reserve(runtime, tokens)
        size = _dimensions(runtime, dimensions)
        outputs = await runtime.encoder.encode(batch, affinity=affinity)
        pooling = runtime.pooling or Pooling()
        vectors = []
        for output in outputs:
            vector = pool(output, pooling.modes) if runtime.encoder.info.returns == "tokens" else output
            vector = np.asarray(vector, dtype=np.float64)
            wants_norm = pooling.normalize if normalize is None else normalize
            if wants_norm:
                vector = normalized(vector)
            if size is not None and size < len(vector):
                # Matryoshka: the leading dimensions, normalized again (as sentence-transformers
                # truncate_dim and vLLM do).
                vector = normalized(vector[:size])
            vectors.append(vector.astype(np.float32))
        self._done(runtime, tokens, start)
        return Encoded(vectors, tokens)

    async def score_pairs(
        self,
        model: str,
        queries: Sequence[str],
        documents: Sequence[str],
        *,
        truncate: int | None = None,
        activate: bool = True,
        affinity: str | None = None,
        query_param: str = "query",
        document_param: str = "documents",
    ) -> Scored:
        """One score per (query, document) pair; `queries` has one entry (against every document)
        or one per document."""
        start = time.perf_counter()
        runtime = await self._runtime(model, "score")
        _count(documents, document_param)
        if len(queries) not in (1, len(documents)):
            raise InvalidRequestError(
                f"give one {query_param} or one per {document_param} "
                f"({len(queries)} against {len(documents)})",
                param=query_param,
            )
        keep = _keep(runtime, truncate)

        def pairs() -> tuple[list[EncoderInput], int]:
            batch: list[EncoderInput] = []
            tokens = 0
            for i, document in enumerate(documents):
                query = queries[0] if len(queries) == 1 else queries[i]
                param = f"{document_param}[{i}]"
                if not query:
                    raise InvalidRequestError(f"{query_param} cannot be an empty string", param=query_param)
                if not document:
                    raise InvalidRequestError("a document cannot be an empty string", param=param)
                ids, types = runtime.tokenizer.encode_pair(query, document, max_length=keep)
                ids = self._fit(runtime, ids, param, None)
                tokens += len(ids)
                batch.append(EncoderInput(ids=tuple(ids), type_ids=tuple(types)))
            return batch, tokens

        if runtime.encoder.info.takes == "text":
            raise InvalidRequestError(f"model {runtime.name!r} takes text, not pairs of texts", param="model")
        repeats = len(documents) if len(queries) == 1 else 1
        chars = sum(map(len, documents)) + repeats * sum(map(len, queries))
        batch, tokens = await _tokenized(runtime.tokenizer, chars, pairs)
        await self._reserve(runtime, tokens)
        outputs = await runtime.encoder.encode(batch, affinity=affinity)
        classifier = runtime.classifier or Classifier()
        scores = [relevance(np.asarray(o), classifier, activate=activate) for o in outputs]
        self._done(runtime, tokens, start)
        return Scored(scores, tokens)


async def _tokenized(tokenizer: Tokenizer, chars: int, work: Callable[[], T]) -> T:
    """A request's tokenizing: inline when its inputs are short and the tokenizer is free, else on
    a thread, so that a long input (megabytes of text take seconds) never holds the event loop."""
    if chars <= INLINE_CHARS and tokenizer.pair_lock.acquire(blocking=False):
        try:
            return work()
        finally:
            tokenizer.pair_lock.release()
    return await asyncio.to_thread(work)


def _keep(runtime: EncoderRuntime, truncate: int | None) -> int | None:
    """How many tokens an input is cut to (None: not cut): truncate_prompt_tokens, -1 meaning the
    model's limit; more than the limit is a 400."""
    if truncate is None:
        return None
    limit = runtime.max_length
    if truncate == -1:
        return limit
    if truncate < 1:
        raise InvalidRequestError(
            "truncate_prompt_tokens must be -1 or at least 1", param="truncate_prompt_tokens"
        )
    if limit is not None and truncate > limit:
        raise InvalidRequestError(
            f"truncate_prompt_tokens ({truncate}) is more than the model's limit of {limit} tokens",
            param="truncate_prompt_tokens",
        )
    return truncate


def _count(inputs: Sequence[Any], param: str) -> None:
    if not inputs:
        raise InvalidRequestError(f"{param} cannot be an empty list", param=param)
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequestError(
            f"{param} has {len(inputs)} entries, more than the {MAX_INPUTS} one request may have", param=param
        )


def _dimensions(runtime: EncoderRuntime, dimensions: int | None) -> int | None:
    if dimensions is None:
        return None
    if dimensions < 1:
        raise InvalidRequestError("dimensions must be at least 1", param="dimensions")
    pooling = runtime.pooling or Pooling()
    width = runtime.encoder.info.width
    if width is not None and dimensions == width:
        return None
    if pooling.any_dimensions and (width is None or dimensions <= width):
        return dimensions
    if dimensions in pooling.matryoshka:
        return dimensions
    if pooling.matryoshka or pooling.any_dimensions:
        allowed = ", ".join(map(str, pooling.matryoshka)) or f"up to {width}"
        raise InvalidRequestError(
            f"model {runtime.name!r} does not take dimensions={dimensions}; it takes {allowed}",
            param="dimensions",
        )
    raise InvalidRequestError(
        f"model {runtime.name!r} does not declare Matryoshka dimensions, so its embeddings cannot be "
        "shortened; leave dimensions out",
        param="dimensions",
    )
