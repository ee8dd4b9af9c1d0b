"""`TritonAdapter`: the Engine protocol over a TensorRT-LLM model in Triton (its ensemble, or the
engine model itself on the `engine` route), one gRPC stream per request.

One stream per request keeps cancellation precise: cancelling the call cancels exactly that
request inside Triton, which the TensorRT-LLM backend notices within cancellation_check_period_ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2

from gateway import tracing
from gateway.asyncutil import merge
from gateway.engine import Engine, EngineInfo, GenerationDelta, GenerationRequest, LoraTensors, TokenLogprob
from gateway.errors import EngineError, EngineUnavailableError, GatewayError, InvalidRequestError
from gateway.routing.base import RouteRequest
from gateway.triton import contract as c
from gateway.triton.connection import TritonConnection, is_connection_failure, rpc_error
from gateway.triton.http import HttpStatusError, StreamError, TransportError
from gateway.triton.http import is_connection_failure as is_http_connection_failure
from gateway.triton.logits import prompt_logprobs
from gateway.triton.pool import Endpoint, TritonPool, first_answer
from gateway.triton.tensors import (
    ParsedResponse,
    build_json_request,
    build_request,
    cancel_request,
    json_request_fits,
    parse_json_response,
    parse_response,
    token_logprobs,
)

logger = logging.getLogger(__name__)

# How long a stop request for a dropped stream may take to reach Triton (also at shutdown).
STOP_REQUEST_TIMEOUT_S = 10.0
# The TensorRT-LLM backend's words for a task id it does not hold (every version since v0.9) and
# for a LoRA cache whose adapters are all in use (older, then newer wording).
LORA_NOT_CACHED = "not found in cache. Please send LoRA weights with request"
LORA_CACHE_FULL = ("Cache is full. There are no done tasks to evict", "PEFT Cache is full")


async def _score_prompt(context: np.ndarray, request: GenerationRequest) -> tuple[TokenLogprob | None, ...]:
    """The prompt's log probabilities from its context logits, off the event loop: a log-softmax
    over [prompt tokens, vocab] takes milliseconds per thousand tokens."""
    top = request.prompt_logprobs or 0
    try:
        return await asyncio.to_thread(prompt_logprobs, context, request.prompt_ids, top)
    except ValueError as exc:
        raise EngineError(f"the engine's context logits do not match the prompt: {exc}") from exc


@dataclass(frozen=True, slots=True)
class RouteChoice:
    """Which Triton model a served model's requests go to, on which route, and why."""

    route: c.Route
    model: str
    reason: str
    # The engine model among the ensemble's steps (for `stop` requests on the ensemble route).
    engine: str | None = None


class TritonAdapter:
    """The Engine protocol over one served model.

    `route` "auto" (the default) looks into the ensemble's `ensemble_scheduling`: when one of its
    steps is a `tensorrt_llm` model (by its tensors, not its name) that Triton serves, requests go
    straight to it with token ids (exact text, no Python pre/post-processing in Triton); otherwise
    through the ensemble. "ensemble" and "engine" force a route.
    """

    def __init__(
        self,
        pool: TritonPool,
        model: str,
        route: c.RouteChoice = "auto",
        *,
        engine_model: str | None = None,
    ) -> None:
        self._pool = pool
        # The model entry's Triton model (normally the ensemble); requests go to self._model.
        self._entry_model = model
        self._model = engine_model if route == "engine" and engine_model else model
        self._requested_route = route
        self._engine_model = engine_model
        # The engine model that takes `stop` requests on the ensemble route: Triton does not pass
        # a cancelled ensemble call (nor a closed HTTP stream) on to the composing models.
        self._cancel_model: str | None = None
        self._contract: c.Contract | None = None
        self._choice: RouteChoice | None = None
        self._info: tuple[c.Contract, EngineInfo] | None = None
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        # LoRA requests of an ensemble that passes no LoRA inputs on go to its engine model.
        self._lora_route: TritonAdapter | None = None
        # Why the last readiness check found the model unavailable (None: it was ready).
        self.unready_reason: str | None = None

    # ------------------------------------------------------------------ introspection

    @property
    def contract(self) -> c.Contract:
        if self._contract is None:
            raise EngineUnavailableError(f"Triton model {self._model!r} is not available yet")
        return self._contract

    @property
    def route_choice(self) -> RouteChoice:
        if self._choice is None:
            raise EngineUnavailableError(f"Triton model {self._model!r} is not available yet")
        return self._choice

    @property
    def info(self) -> EngineInfo:
        k = self.contract
        # Asked for several times per request: made once per contract learned.
        if self._info is not None and self._info[0] is k:
            return self._info[1]
        info = k.capabilities()
        if self._pool.policy.needs_prompt_ids and not info.needs_prompt_ids:
            # The routing policy reads the prompt's token ids: tokenize before sending.
            info = replace(info, needs_prompt_ids=True)
        if self._choice is not None:
            info = replace(info, route_reason=self._choice.reason)
        self._info = (k, info)
        return info

    async def introspect(self) -> c.Contract:
        """Read the model config (and whether its composing models are decoupled) over gRPC."""
        async with self._lock:
            if self._contract is not None:
                return self._contract
            choice, contract = await first_answer(self._pool, self._model, self._read_contract)
            self._choice = choice
            self._model = choice.model
            self._contract = contract
            logger.info(
                "model %s: %s route (%s); %s contract, decoupled=%s, output_ids=%s, native n=%s",
                self._entry_model,
                choice.route,
                choice.reason,
                contract.variant,
                contract.decoupled,
                contract.exposes_token_ids,
                contract.native_num_sequences,
            )
            if not contract.exact_stream():
                logger.warning(
                    "streamed text through ensemble %s is lossy (%s): its postprocessing decodes "
                    "each response's tokens alone (lost SentencePiece spaces, U+FFFD for split "
                    "characters). Non-streamed requests are exact. Fix: use the engine route "
                    "(the default when Triton serves the ensemble's tensorrt_llm model).",
                    choice.model,
                    choice.reason,
                )
            return contract

    async def _choose_route(self, conn: TritonConnection) -> tuple[RouteChoice, mc.ModelConfig]:
        """Which model and route; returns the chosen model's config too."""
        requested, entry = self._requested_route, self._entry_model
        if requested == "engine" and self._engine_model:
            config = await conn.model_config(self._engine_model)
            return RouteChoice("engine", self._engine_model, "route=engine configured"), config
        config = await conn.model_config(entry)
        steps = [step.model_name for step in config.ensemble_scheduling.step]
        if not steps:
            if c.is_engine(config) and requested != "ensemble":
                return RouteChoice("engine", entry, f"{entry} is a tensorrt_llm model itself"), config
            reason = f"{entry} is not an ensemble of a tensorrt_llm model"
            return RouteChoice("ensemble", entry, reason), config
        engine: str | None = None
        engine_config: mc.ModelConfig | None = None
        for name in steps:
            if self._engine_model and name != self._engine_model:
                continue
            sub = await conn.model_config(name)
            if c.is_engine(sub):
                engine, engine_config = name, sub
                break
        if requested == "ensemble":
            return RouteChoice("ensemble", entry, "route=ensemble configured", engine), config
        if c.is_multimodal(config) and requested != "engine":
            # Its encoder step turns a request's images into the engine's prompt table: the
            # engine alone cannot take them.
            reason = f"{entry} is a multimodal ensemble: its encoder step computes the images' features"
            return RouteChoice("ensemble", entry, reason, engine), config
        if engine is None or engine_config is None:
            if requested == "engine":
                raise EngineUnavailableError(
                    f"route=engine: no step of {entry}'s ensemble_scheduling is a tensorrt_llm model "
                    "(name one with engine_model=...)"
                )
            return RouteChoice("ensemble", entry, f"no step of {entry} is a tensorrt_llm model", None), config
        if requested == "engine":
            return RouteChoice("engine", engine, f"route=engine configured; {engine} from {entry}'s steps"), (
                engine_config
            )
        if not await conn.model_ready(engine):
            return RouteChoice("ensemble", entry, f"{entry}'s engine {engine} is not ready", engine), config
        reason = f"Triton serves {entry}'s tensorrt_llm step {engine}: token ids go straight to it"
        return RouteChoice("engine", engine, reason, engine), engine_config

    async def _read_contract(self, endpoint: Endpoint) -> tuple[RouteChoice, c.Contract]:
        conn = endpoint.connection
        choice, config = await self._choose_route(conn)
        if choice.route == "engine":
            contract = c.read_contract(config, "engine")
            return choice, contract.with_settings(c.engine_settings(c.parameters(config)))
        # Ensembles rarely declare decoupled themselves: they are when a composing model is.
        decoupled = bool(config.model_transaction_policy.decoupled)
        engine_params: dict[str, str] | None = None
        text_params: dict[str, str] | None = None
        for step in config.ensemble_scheduling.step:
            sub = await conn.model_config(step.model_name)
            decoupled = decoupled or bool(sub.model_transaction_policy.decoupled)
            if step.model_name == choice.engine:
                engine_params = c.parameters(sub)
                if any(i.name == "stop" for i in sub.input):
                    self._cancel_model = step.model_name
            if c.TEXT_OUTPUT in step.output_map.values():
                text_params = c.parameters(sub)
        contract = c.read_contract(config, "ensemble").with_decoupled(decoupled)
        return choice, contract.with_settings(c.engine_settings(engine_params, text_params))

    async def ensure_ready(self) -> None:
        if self._contract is None:
            await self.introspect()

    async def is_ready(self) -> bool:
        """Ready when any endpoint serves the model; if none does, `unready_reason` says why."""
        reasons = []
        for endpoint in self._pool.endpoints:
            conn = endpoint.connection
            try:
                ready = await conn.model_ready(self._model)
            except grpc.aio.AioRpcError as exc:
                reasons.append(rpc_error(exc, self._model, url=endpoint.url).message)
                continue
            if not ready:
                reasons.append(f"Triton at {endpoint.url} has no model {self._model!r} ready")
                continue
            if self._contract is None:
                try:
                    await self.introspect()
                except GatewayError as exc:
                    self.unready_reason = exc.message
                    return False
            self.unready_reason = None
            return True
        self.unready_reason = "; ".join(reasons) or None
        return False

    async def close(self) -> None:
        """Sends the stop requests still on their way before the pool (shared by every model, closed
        by its owner) goes: streams cut when the shutdown grace period ends leave their ensemble
        requests running in the engine until these reach it (a closed stream is not passed on to
        the composing models), so a worker must not exit before."""
        adapters = [self, *([self._lora_route] if self._lora_route is not None else [])]
        pending = {task for adapter in adapters for task in adapter._background}
        if pending:
            await asyncio.wait(pending, timeout=STOP_REQUEST_TIMEOUT_S)

    async def lora_engine(self) -> Engine:
        """This adapter where its model takes LoRA inputs; else, for an ensemble older than
        TensorRT-LLM v0.15 (it passes none on), an adapter of its engine model on the engine route."""
        await self.ensure_ready()
        if self.contract.lora:
            return self
        choice = self.route_choice
        if choice.route == "ensemble" and choice.engine:
            if self._lora_route is None:
                self._lora_route = TritonAdapter(
                    self._pool, self._entry_model, "engine", engine_model=choice.engine
                )
            await self._lora_route.ensure_ready()
            if self._lora_route.contract.lora:
                return self._lora_route
        raise InvalidRequestError(
            f"Triton's {self._model!r} takes no LoRA inputs (lora_task_id, lora_weights, lora_config)"
            + (
                ", and no engine model that does is reachable (ensembles pass LoRA inputs on from "
                "TensorRT-LLM v0.15; set engine_model or route=engine)"
                if choice.route == "ensemble"
                else " (its engine was built without the LoRA plugin?)"
            ),
            param="model",
            code="lora_not_supported",
        )

    # ------------------------------------------------------------------ generation

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        contract = self.contract
        n = request.num_sequences
        seed = request.params.seed
        if n == 1 or contract.native_num_sequences:
            # The stream itself, not a generator around it: one layer less on every token.
            return self._stream(contract, request, seed=seed, num_sequences=n, index=0)
        # No num_return_sequences: n independent requests, each with its own seed so that
        # sampled choices differ (and stay reproducible for a given request seed).
        # The prompt is scored once, by the first of them.
        streams = [
            self._stream(
                contract,
                request if i == 0 else replace(request, prompt_logprobs=None),
                seed=None if seed is None else (seed + i) % 2**64,
                num_sequences=1,
                index=i,
            )
            for i in range(n)
        ]
        return merge(streams)

    async def _stream(
        self,
        contract: c.Contract,
        request: GenerationRequest,
        *,
        seed: int | None,
        num_sequences: int,
        index: int,
    ) -> AsyncIterator[GenerationDelta]:
        streaming = contract.streams(request.stream)
        # Numeric ids: older TensorRT-LLM backends only accept request ids that parse as integers,
        # and the id is what a `stop` request uses to find this request in the engine.
        triton_id = str(random.getrandbits(63))
        infer_request: service_pb2.ModelInferRequest | None = None
        json_request: dict[str, object] | None = None
        # Streams go over HTTP where configured; a whole result is one response, so gRPC costs it
        # nothing more, and there cancelling the call stops the request at once. A dropped ensemble
        # stream is ended by the `stop` request either way (Triton passes neither a cancelled call
        # nor a closed HTTP stream on to the composing models); 200 dropped streams drained as fast
        # beside HTTP streams as beside gRPC ones (docs/bench/notes-2026-11-25.md, "Cancellation").
        over_http = streaming and json_request_fits(contract, request)

        # Ids that repeat the prompt are cut here; a text that does is cut by the serving layer.
        strip = len(request.prompt_ids) if contract.repeats_prompt(request.stream) else 0
        single = not contract.decoupled
        block_size = contract.tokens_per_block or 0
        lora = request.lora
        route = RouteRequest(
            request.prompt_ids,
            contract.tokens_per_block,
            request.affinity,
            None if lora is None or not contract.lora else lora.task_id,
        )
        tried: list[Endpoint] = []
        # The prompt's log probabilities, once the engine has returned its context logits.
        scored = request.prompt_logprobs is None or not contract.prompt_logprobs
        # A LoRA request whose adapter the backend no longer holds goes again, once, with the
        # adapter's weights, to the same endpoint.
        lora_tensors: LoraTensors | None = None
        resend: Endpoint | None = None
        while True:
            endpoint = resend or self._pool.pick(tried, route)
            if resend is None:
                tried.append(endpoint)
            resend = None
            first = True
            endpoint.begin()
            span = tracing.start_span(
                "triton.infer", model=self._model, endpoint=endpoint.url, request_id=triton_id
            )
            responses: AsyncIterator[ParsedResponse]
            if endpoint.http is not None and over_http:
                if json_request is None:
                    json_request = build_json_request(
                        contract,
                        request,
                        request_id=triton_id,
                        seed=seed,
                        num_sequences=num_sequences,
                        stream=streaming,
                    )
                responses = self._call_http(
                    endpoint, json_request, whole=not streaming, request_id=triton_id, span=span
                )
            else:
                if infer_request is None:
                    infer_request = build_request(
                        contract,
                        request,
                        request_id=triton_id,
                        seed=seed,
                        num_sequences=num_sequences,
                        stream=streaming,
                        lora=lora_tensors,
                    )
                responses = self._call(
                    endpoint, infer_request, single=single, request_id=triton_id, span=span
                )
            try:
                async for parsed in responses:
                    if first:
                        self._pool.succeeded(endpoint)
                        first = False
                    if parsed.empty:
                        continue
                    prompt = None
                    if not scored and parsed.context_logits is not None:
                        prompt = await _score_prompt(parsed.context_logits, request)
                        scored = True
                    ids = parsed.token_ids
                    if ids is not None and strip:
                        ids = ids[strip:]
                    if ids is not None:
                        count = len(ids)
                    elif parsed.num_output_tokens is not None:
                        count = parsed.num_output_tokens
                    elif not streaming and parsed.log_probs is not None:
                        # A whole text-only result: one log probability per generated token.
                        count = len(parsed.log_probs)
                    else:
                        # A streamed response is one decoding step: one token, whatever its text
                        # decodes to (a token alone may decode to nothing).
                        count = 1
                    yield GenerationDelta(
                        index=index + parsed.index,
                        token_ids=ids,
                        text=parsed.text,
                        num_tokens=count,
                        num_input_tokens=parsed.num_input_tokens,
                        cached_tokens=None
                        if parsed.kv_cache_reused_blocks is None
                        else parsed.kv_cache_reused_blocks * block_size,
                        logprobs=token_logprobs(parsed, ids, request.logprobs)
                        if request.logprobs is not None
                        else None,
                        prompt_logprobs=prompt,
                    )
                if not scored:
                    raise EngineError(
                        f"Triton model {self._model!r} returned no context logits to score the prompt"
                    )
                return
            except EngineError as exc:
                if lora is None or not first:
                    raise
                if LORA_NOT_CACHED in exc.message and lora_tensors is None:
                    lora_tensors = await lora.tensors()
                    if lora.on_miss is not None:
                        lora.on_miss()
                    logger.info(
                        "LoRA adapter %s (task %d) not held by Triton at %s: sending its weights",
                        lora.name,
                        lora_tensors.task_id,
                        endpoint.url,
                    )
                    infer_request = None
                    resend = endpoint
                    continue
                if any(text in exc.message for text in LORA_CACHE_FULL):
                    raise EngineUnavailableError(
                        "The engine's LoRA cache is full of adapters that requests are using; retry shortly.",
                        code="lora_cache_full",
                        headers={"retry-after": "1"},
                    ) from None
                raise
            except _Failover as failure:
                # Nothing reached the client yet: another endpoint can serve the request.
                self._pool.failed(endpoint, failure.reason)
                if len(tried) >= len(self._pool.endpoints):
                    raise failure.error from None
            finally:
                endpoint.end()
                span.end()

    async def _call(
        self,
        endpoint: Endpoint,
        request: service_pb2.ModelInferRequest,
        *,
        single: bool,
        request_id: str,
        span: tracing.Span,
    ) -> AsyncIterator[ParsedResponse]:
        """One gRPC stream: parsed responses until the final one. Closing it early cancels the call."""
        connection = endpoint.connection
        call = connection.open_stream(span.grpc_metadata())
        finished = False
        started = False
        try:
            with contextlib.suppress(asyncio.InvalidStateError):
                # Raised when the call has already ended (Triton unreachable): reading it below
                # raises the call's own status, like any failed call.
                await call.write(request)
            async for response in call:
                if response.error_message:
                    raise rpc_error(response.error_message, self._model)
                parsed = parse_response(response.infer_response)
                started = True
                yield parsed
                if parsed.final or single:
                    break
            finished = True
        except grpc.aio.AioRpcError as exc:
            finished = True
            span.error(exc)
            if not started and is_connection_failure(exc):
                raise _Failover(exc.details() or exc.code().name, rpc_error(exc, self._model)) from None
            if started and exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._pool.failed(endpoint, "lost mid-stream")
            raise rpc_error(exc, self._model) from None
        finally:
            if finished:
                # Our side stays open until the final response (half-closing early is not needed
                # and some proxies take it as the end of the call), then closes like any client's.
                connection.end_stream(call)
            else:
                call.cancel()
                if self._cancel_model is not None and started:
                    self._send_cancel(endpoint, self._cancel_model, request_id)

    async def _call_http(
        self,
        endpoint: Endpoint,
        body: dict[str, object],
        *,
        whole: bool,
        request_id: str,
        span: tracing.Span,
    ) -> AsyncIterator[ParsedResponse]:
        """One HTTP generate_stream: parsed responses until Triton ends it (its final response).
        Closing it early closes the connection, and Triton cancels the request when it next writes
        to it (the engine's next step); on the ensemble route the engine also gets a `stop`.
        (On the engine route a `stop` as well made 200 dropped streams take 11 s to drain instead
        of 1.2 s on the CPU engine.)"""
        http = endpoint.http
        assert http is not None
        metadata = span.grpc_metadata()
        finished = False
        started = False
        try:
            async with contextlib.aclosing(
                http.generate_stream(self._model, body, dict(metadata) if metadata else None)
            ) as events:
                async for event in events:
                    parsed = parse_json_response(event, whole=whole)
                    started = True
                    yield parsed
            finished = True
        except (HttpStatusError, StreamError) as exc:
            finished = True
            span.error(exc)
            raise rpc_error(str(exc), self._model) from None
        except (TransportError, asyncio.TimeoutError) as exc:
            finished = True
            span.error(exc)
            reason = str(exc) or type(exc).__name__
            error = EngineUnavailableError(f"Triton is unavailable ({reason})")
            if not started and is_http_connection_failure(exc):
                raise _Failover(reason, error) from None
            if started:
                self._pool.failed(endpoint, "lost mid-stream")
            raise error from None
        finally:
            if not finished and self._cancel_model is not None:
                self._send_cancel(endpoint, self._cancel_model, request_id)

    def _send_cancel(self, endpoint: Endpoint, model: str, request_id: str) -> None:
        """Fire-and-forget: tell the engine to stop a request nobody waits for any more."""
        stop = cancel_request(model, request_id)

        async def send() -> None:
            async def one() -> AsyncIterator[service_pb2.ModelInferRequest]:
                yield stop

            try:
                async for response in endpoint.connection.stub.ModelStreamInfer(
                    one(), timeout=STOP_REQUEST_TIMEOUT_S
                ):
                    if response.error_message:
                        logger.warning("stop request for %s failed: %s", request_id, response.error_message)
                    break
            except grpc.aio.AioRpcError as exc:
                logger.warning("stop request for %s failed: %s", request_id, exc.details())

        task = asyncio.create_task(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class _Failover(Exception):
    def __init__(self, reason: str, error: GatewayError) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
