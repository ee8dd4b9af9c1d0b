"""Typed settings: flags, `GATEWAY_*` environment variables and an optional YAML file, in that order."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.routing.registry import DEFAULT_POLICY, POLICY_NAMES
from gateway.text.reasoning.registry import MODEL_FORMATS as REASONING_FORMATS
from gateway.text.tool_calls.registry import MODEL_FORMATS

Route = Literal["auto", "ensemble", "engine"]
LogLevel = Literal["critical", "error", "warning", "info", "debug"]
# Settings whose flag differs from `--field-name` (repeatable, singular).
FLAG_NAMES = {
    "triton_url": "--triton-url",
    "models": "--model",
    "key_rate_limits": "--key-rate-limit",
    "lora_modules": "--lora",
}
# A gRPC target: HOST:PORT (IPv6 in brackets), or one of gRPC's own schemes (dns:, unix:, ...).
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(\d{1,5})$")
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


def flag_name(field: str) -> str:
    return FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def env_name(field: str) -> str:
    return f"GATEWAY_{field.upper()}"


def check_triton_url(url: str) -> str:
    """A Triton gRPC address as grpc takes it, or a ValueError saying what is wrong with it."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("http", "https", "grpc", "grpcs"):
        raise ValueError(
            f"{url!r}: Triton's gRPC address is HOST:PORT, without a scheme "
            f"(try {rest.rstrip('/')!r}; Triton's gRPC port is 8001 by default, its HTTP port 8000)"
        )
    if url.startswith(_GRPC_SCHEMES):
        return url
    match = _HOST_PORT.match(url)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"{url!r} is not HOST:PORT (for example 127.0.0.1:8001)")
    return url


def check_triton_http_url(url: str) -> str:
    """A Triton HTTP endpoint, http(s)://HOST:PORT, or a ValueError saying what is wrong with it."""
    scheme, sep, rest = url.partition("://")
    host_port = rest.rstrip("/")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError(
            f"{url!r}: Triton's HTTP endpoint is http://HOST:PORT (its HTTP port is 8000 by default)"
        )
    match = _HOST_PORT.match(host_port)
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"{url!r} is not http://HOST:PORT (for example http://127.0.0.1:8000)")
    return f"{scheme.lower()}://{host_port}"


def check_triton_metrics_url(url: str) -> str:
    """A Triton metrics URL, http(s)://HOST:PORT/metrics, or a ValueError saying what is wrong with it."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"Triton metrics URL {url!r}: expected http://HOST:PORT/metrics")
    return url


# Each Triton URL list's check, item by item.
_URL_CHECKS: dict[str, Callable[[str], str]] = {
    "triton_url": check_triton_url,
    "triton_http_url": check_triton_http_url,
    "triton_metrics_url": check_triton_metrics_url,
}

_SPEC_VALUES = {"tokenizer": "DIR", "chat_template": "FILE", "max_model_len": "N", "name": "NAME"}


def registered(field: str, value: str, allowed: tuple[str, ...]) -> str:
    """A plug-in name from its registry (tool and reasoning formats, routing policies)."""
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}, not {value!r}")
    return value


class ServedModel(BaseModel):
    """One model as clients see it, and where it lives in Triton."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Model name clients send in `model`.")
    triton_model: str = Field(default="ensemble", description="The model's ensemble in Triton.")
    engine_model: str | None = Field(
        default=None,
        description="The `tensorrt_llm` model the engine route calls (token ids in and out); "
        "default: the ensemble's step that is one.",
    )
    tokenizer: Path = Field(description="Local Hugging Face directory with the tokenizer (and its configs).")
    route: Route = Field(
        default="auto",
        description="`auto`: the engine route when Triton serves the ensemble's tensorrt_llm model, else "
        "the ensemble; `ensemble` (text in Triton) or `engine` (token ids) to force one.",
    )
    chat_template: Path | None = Field(
        default=None, description="Jinja chat template file overriding the tokenizer's."
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="Context length; default from the model's config.json."
    )
    tool_parser: str = Field(
        default="none",
        description="How this model writes tool calls: "
        + " | ".join(MODEL_FORMATS)
        + " (none: tools only with guided decoding).",
    )
    default_max_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Output limit when a request sets none (max_tokens, max_output_tokens); "
        "none: what is left of the context.",
    )
    default_limit_status: Literal["incomplete", "completed"] = Field(
        default="incomplete",
        description="How a Responses API response cut by default_max_tokens (the client set no "
        "max_output_tokens) ends: incomplete, as OpenAI reports any cut, or completed, for agents "
        "that treat incomplete as an error (the Codex CLI, the OpenAI Agents SDK).",
    )
    reasoning_parser: str = Field(
        default="none",
        description="How this model writes its thinking: "
        + " | ".join(REASONING_FORMATS)
        + " (none: the whole reply is the answer).",
    )
    task: Literal["auto", "generate", "embed", "score"] = Field(
        default="auto",
        description="What the model does: `generate` (a TensorRT-LLM generator), `embed` (an encoder "
        "for /v1/embeddings), `score` (a cross-encoder for /v1/rerank and /v1/score); `auto`: from the "
        "tokenizer directory (a sentence-transformers layout embeds, a *ForSequenceClassification "
        "model scores, anything else generates).",
    )
    encoder_output: str | None = Field(
        default=None,
        description="An encoder's Triton output to read; default: the pooled output where the model "
        "has one, else its per-token hidden states.",
    )
    add_special_tokens: bool = Field(
        default=True,
        description="Whether Triton's preprocessing adds the tokenizer's special tokens (BOS), as "
        "upstream's does by default: a completions prompt gets them; a chat prompt only those its "
        "template writes (on the ensemble route the gateway leaves a BOS the template writes out of "
        "the text it sends).",
    )

    @field_validator("tool_parser")
    @classmethod
    def _registered_tool_parser(cls, value: str) -> str:
        return registered("tool_parser", value, MODEL_FORMATS)

    @field_validator("reasoning_parser")
    @classmethod
    def _registered_reasoning_parser(cls, value: str) -> str:
        return registered("reasoning_parser", value, REASONING_FORMATS)

    @classmethod
    def parse_spec(cls, spec: str) -> ServedModel:
        """`name=tiny,triton_model=ensemble,tokenizer=/models/tiny,route=ensemble` -> ServedModel."""
        return cls.model_validate(cls.spec_fields(spec))

    @staticmethod
    def spec_fields(spec: str) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"model spec part {part!r} is not key=value (in {spec!r})")
            fields[key.strip()] = value.strip()
        return fields

    @classmethod
    def spec_syntax(cls) -> str:
        """The `--model` value's syntax, from the fields (so help never misses one)."""
        parts = []
        for name, field in cls.model_fields.items():
            choices = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
            if name == "tool_parser":
                choices = MODEL_FORMATS
            if field.annotation is bool:
                choices = ("true", "false")
            value = "|".join(choices) if choices else _SPEC_VALUES.get(name, name.upper())
            parts.append(f"{name}={value}" if field.is_required() else f"[,{name}={value}]")
        return ",".join(p for p in parts if not p.startswith("[")) + "".join(
            p for p in parts if p.startswith("[")
        )


class KeyRateLimit(BaseModel):
    """One API key's own rate limits (`key=KEY,rpm=N,tpm=N`); a limit left out is the default's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, description="The API key (one of api_keys or api_key_file).")
    rpm: int | None = Field(default=None, ge=1, description="Requests per minute.")
    tpm: int | None = Field(default=None, ge=1, description="Tokens per minute.")

    @classmethod
    def parse_spec(cls, spec: str) -> KeyRateLimit:
        return cls.model_validate(ServedModel.spec_fields(spec))


class LoraModule(BaseModel):
    """One LoRA adapter served as a model (`NAME=PATH[,base=MODEL][,server_path=PATH]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Model name clients send in `model` (or `BASE:NAME`).")
    path: Path = Field(
        description="The adapter directory: hf_lora_convert.py output (model.lora_weights.npy, "
        "model.lora_config.npy) or a Hugging Face PEFT directory (adapter_config.json, "
        "adapter_model.safetensors)."
    )
    base: str | None = Field(default=None, description="The served model it adapts; default: the only one.")
    server_path: str | None = Field(
        default=None,
        description="The PEFT directory as the Triton server sees it, for the llmapi model (it loads "
        "adapters itself).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        from gateway.lora import check_name

        return check_name(value)

    @classmethod
    def parse_spec(cls, spec: str) -> LoraModule:
        """`my-adapter=/adapters/a,base=tiny` -> LoraModule."""
        return cls.model_validate(cls.spec_fields(spec))

    @staticmethod
    def spec_fields(spec: str) -> dict[str, Any]:
        head, _, rest = spec.partition(",")
        name, sep, path = head.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"LoRA spec {spec!r} does not start with NAME=PATH")
        fields: dict[str, Any] = {"name": name.strip(), "path": path.strip()}
        if rest:
            fields.update(ServedModel.spec_fields(rest))
        return fields


def _split_env(
    text: str, *, separators: str = ",", item: Callable[[str], Any] = str.strip, json_opens: str = "["
) -> Any:
    """A list setting written as one string (the environment, a flag): JSON as pydantic-settings
    writes it (when it opens with `json_opens`), or items separated by any of `separators`, empty
    ones dropped, each made a value by `item`."""
    text = text.strip()
    if text.startswith(json_opens):
        return json.loads(text)
    return [item(part) for part in re.split(f"[{re.escape(separators)}]", text) if part.strip()]


def _env_list(value: Any) -> Any:
    return _split_env(value) if isinstance(value, str) else value


_T = TypeVar("_T")
# A list setting the environment (or a config file) may give as one string: `a,b`, or JSON as
# pydantic-settings writes it.
EnvList = Annotated[list[_T], NoDecode, BeforeValidator(_env_list)]


def _spec_entries(value: Any, spec_fields: Callable[[str], dict[str, Any]]) -> Any:
    """A list of `key=value,...` specs as the flags, the environment and YAML give it: a JSON array,
    one string of specs separated by `;` or newlines, or a list; each spec string becomes its fields."""
    if isinstance(value, str):
        return _split_env(value, separators=";\n", item=spec_fields)
    if isinstance(value, list):
        return [spec_fields(v) if isinstance(v, str) else v for v in value]
    return value


def _objective_priority(item: str) -> tuple[str, str]:
    name, sep, priority = item.strip().partition("=")
    if not sep or not name.strip():
        raise ValueError(f"{item.strip()!r}: expected NAME=PRIORITY")
    return name.strip(), priority.strip()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="forbid", env_nested_delimiter="__")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=9000, ge=0, le=65535, description="Port to listen on.")
    workers: int = Field(default=1, ge=1, description="Worker processes sharing the port.")
    worker_sockets: Literal["reuseport", "shared"] = Field(
        default="reuseport",
        description="With several workers: `reuseport` gives each worker its own SO_REUSEPORT socket "
        "(the kernel spreads connections over them); `shared`, one socket they all accept on "
        "(uvicorn's own way).",
    )
    triton_url: EnvList[str] = Field(
        default_factory=lambda: ["127.0.0.1:8001"], description="Triton gRPC endpoint(s), HOST:PORT."
    )
    triton_http_url: EnvList[str] = Field(
        default_factory=list,
        description="Triton HTTP endpoint(s), http://HOST:PORT, one per --triton-url in the same order: "
        "generation streams over Triton's HTTP generate_stream, about a third of gRPC's client CPU per "
        "token; model configs, readiness, stop requests and top log probabilities stay on gRPC.",
    )
    triton_metrics_url: EnvList[str] = Field(
        default_factory=list,
        description="Triton metrics URL(s), http://HOST:PORT/metrics (Triton's --metrics-port, 8002): "
        "its queue and KV-cache gauges join the model-server metrics on /metrics that an Inference "
        "Gateway endpoint picker reads; none: those report what the gateway knows alone.",
    )
    triton_metrics_cache_s: float = Field(
        default=1.0,
        gt=0,
        description="How long a read of Triton's metrics serves the scrapes of /metrics that follow.",
    )
    lora_max_running: int | None = Field(
        default=None,
        ge=1,
        description="The most LoRA adapters the engine holds at once (its LoRA cache in adapters), "
        "reported as max_lora to an Inference Gateway endpoint picker; none: not reported.",
    )
    objective_priorities: Annotated[dict[str, int], NoDecode] = Field(
        default_factory=dict,
        description="Inference Gateway InferenceObjective priorities by objective name (higher is more "
        "urgent, as the objectives set them): a request naming one in its x-llm-d-inference-objective "
        "header is admitted at the negated priority unless its body sets one; NAME=PRIORITY, "
        "comma-separated.",
    )
    models: Annotated[list[ServedModel], NoDecode] = Field(
        default_factory=list,
        description="Served models, each as name=NAME,tokenizer=DIR,... (in the environment: "
        "several separated by `;`, or JSON)",
    )
    lora_modules: Annotated[list[LoraModule], NoDecode] = Field(
        default_factory=list,
        description="LoRA adapters served as models, each as NAME=PATH[,base=MODEL][,server_path=PATH] "
        "(in the environment: several separated by `;`, or JSON)",
    )
    lora_max_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description="LoRA adapter tensors kept in the gateway's memory; beyond it the least recently used "
        "are dropped and read from their files again when next needed.",
    )
    lora_dynamic_roots: EnvList[Path] = Field(
        default_factory=list,
        description="Directories POST /v1/load_lora_adapter may load adapters from (comma-separated in "
        "the environment); none: dynamic loading is off. Needs admin_api_keys.",
    )
    admin_api_keys: EnvList[str] = Field(
        default_factory=list,
        description="Keys for the admin endpoints (/v1/load_lora_adapter, /v1/unload_lora_adapter; "
        "comma-separated in the environment); none: those endpoints are off.",
    )
    config_file: Path | None = Field(default=None, description="YAML file with any of these settings.")
    log_level: LogLevel = Field(default="info", description="Logging level.")
    log_format: Literal["text", "json"] = Field(default="text", description="Log lines as text or JSON.")
    access_log: bool = Field(default=True, description="One log line per request (never prompt text).")
    tracing: bool = Field(
        default=False,
        description="OpenTelemetry spans (needs the otel extra); OTLP exporter set by the OTEL_* variables.",
    )
    routing_policy: str = Field(
        default=DEFAULT_POLICY,
        description="How a request picks among several --triton-url endpoints: "
        + " | ".join(POLICY_NAMES)
        + " (prefix: to the endpoint whose KV cache most likely holds the prompt's prefix).",
    )
    routing_block_size: int = Field(
        default=32,
        ge=1,
        description="prefix routing: tokens per block when the engine model has no tokens_per_block.",
    )
    routing_index_blocks: int = Field(
        default=65536, ge=1, description="prefix routing: block hashes remembered per endpoint."
    )
    routing_ttl_s: float = Field(
        default=600.0, gt=0, description="prefix routing: how long a block hash or affinity is remembered."
    )
    routing_load_margin: int = Field(
        default=4,
        ge=0,
        description="prefix routing: in-flight requests by which the best-matching endpoint may always "
        "exceed the least loaded; beyond them, --routing-load-factor decides.",
    )
    routing_load_factor: float = Field(
        default=1.5,
        ge=1.0,
        description="prefix routing: the best-matching endpoint gives way to the least loaded when, "
        "beyond --routing-load-margin, it would have more than this times the mean requests in flight.",
    )
    triton_connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Deadline for Triton metadata calls (config, readiness)."
    )
    triton_stream_idle_timeout_s: float = Field(
        default=300.0,
        ge=0,
        description="A started HTTP generate_stream that sends nothing for this long fails, and Triton "
        "is cancelled (0: no limit): Triton's HTTP frontend can lose a stream's end under load. The same "
        "bound holds for every request to an llmapi model, which may drop a request without an answer: "
        "a 504 and the request cancelled (0: 600 s there; a model that is not decoupled answers once, "
        "so there it bounds the whole generation).",
    )
    readiness_cache_s: float = Field(
        default=1.0, ge=0, description="How long a Triton readiness answer is reused by /health/ready."
    )
    max_n: int = Field(default=16, ge=1, description="Largest `n` accepted.")
    max_stop_strings: int = Field(default=16, ge=0, description="Most stop strings per request.")
    max_stop_string_length: int = Field(default=256, ge=1, description="Longest stop string, in characters.")
    sse_ping_s: float = Field(default=15.0, ge=0, description="SSE keep-alive comment interval (0: off).")
    api_keys: EnvList[str] = Field(
        default_factory=list,
        description="Accepted API keys (comma-separated in the environment); none configured: no auth.",
    )
    api_key_file: Path | None = Field(
        default=None,
        description="File with one accepted API key per line, each optionally followed by "
        "priority=N (its requests' default priority; lower is more urgent) and its own rate limits "
        "rpm=N, tpm=N.",
    )
    protect_metrics: bool = Field(default=False, description="Require an API key for /metrics too.")
    cors_origins: EnvList[str] = Field(
        default_factory=list, description="Allowed CORS origins (comma-separated); empty: CORS off."
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest request body (413 above)."
    )
    max_concurrent_requests: int = Field(
        default=2048, ge=1, description="Generation requests served at once per worker process."
    )
    max_queued_requests: int = Field(
        default=1024, ge=0, description="Generation requests waiting for a slot; beyond that: 429."
    )
    queue_timeout_s: float = Field(default=30.0, gt=0, description="Longest wait for a slot before a 429.")
    request_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Deadline per generation request (504 and Triton cancelled); none: no deadline.",
    )
    reject_unknown_fields: bool = Field(
        default=False,
        description="Answer 400 to a request field OpenAI does not define, as OpenAI does "
        "(off: such fields are ignored and named in the x-gateway-ignored-fields response header).",
    )
    max_prompt_tokens: int | None = Field(default=None, ge=1, description="Largest prompt, in tokens.")
    max_tokens_limit: int | None = Field(
        default=None, ge=1, description="Largest max_tokens a request may ask."
    )
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="Idle HTTP keep-alive, longer than clients' pool idle time (no reuse of a closing one).",
    )
    keep_alive_requests: int = Field(
        default=0,
        ge=0,
        description="Close a client connection after this many requests on it (0: never), so that "
        "SO_REUSEPORT workers get reconnecting clients anew rather than keep the long-lived "
        "connections they first got (a load balancer's pool).",
    )
    shutdown_grace_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long open streams may run before they are cancelled."
    )

    @field_validator("routing_policy")
    @classmethod
    def _registered_policy(cls, value: str) -> str:
        return registered("routing_policy", value, POLICY_NAMES)

    state_dir: Path = Field(
        default_factory=lambda: Path.home() / ".local" / "state" / "trtllm-openai-gateway",
        description="Where the gateway keeps state: stored responses, the reasoning encryption key.",
    )
    response_store: str = Field(
        default="sqlite",
        description="Where stored responses live: sqlite (a file in state_dir), memory (this process) "
        "or redis (the state_url server; the default when state_url is set).",
    )
    response_store_max_age_s: float | None = Field(
        default=30 * 24 * 3600.0, gt=0, description="Stored responses older than this are dropped."
    )
    response_store_max_count: int | None = Field(
        default=100_000, ge=1, description="At most this many stored responses, the oldest dropped first."
    )
    reasoning_encryption_key: str | None = Field(
        default=None,
        description="Base64 of 32 bytes sealing reasoning.encrypted_content (the same on every replica); "
        "none: made once and kept in state_dir.",
    )
    strict_tools: bool = Field(
        default=False,
        description="A Responses tool the gateway cannot run (web_search, mcp, ...) is a 400 "
        "instead of being left out.",
    )
    state_url: str | None = Field(
        default=None,
        description="Redis or Valkey server shared by gateway replicas (redis://HOST:PORT/DB, rediss://, "
        "unix://): stored responses and rate limits live there. None: in this process / state_dir.",
    )
    rate_limit_rpm: int | None = Field(
        default=None, ge=1, description="Requests per minute per API key (none: unlimited)."
    )
    rate_limit_tpm: int | None = Field(
        default=None,
        ge=1,
        description="Tokens per minute per API key: prompt plus max_tokens reserved at admission, "
        "settled to the real usage at the end (none: unlimited).",
    )
    key_rate_limits: Annotated[list[KeyRateLimit], NoDecode] = Field(
        default_factory=list,
        description="One key's own limits, key=KEY[,rpm=N][,tpm=N] (a limit left out is the default)",
    )
    media_url_fetch: bool = Field(
        default=True,
        description="Fetch http(s) image URLs (false: images only as data: URIs or base64 blocks). "
        "Loopback, private, link-local, cloud-metadata and other non-public addresses are always "
        "refused, after DNS resolution and after every redirect.",
    )
    allowed_media_domains: EnvList[str] = Field(
        default_factory=list,
        description="The only hosts image URLs may name (exact names, comma-separated in the "
        "environment); empty: any public host. A host named here may resolve to a private address "
        "(an internal image server); metadata, multicast and unspecified addresses stay refused.",
    )
    media_connect_timeout_s: float = Field(
        default=5.0, gt=0, description="Longest wait to connect to an image URL's server."
    )
    media_read_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait for an image URL's bytes (the whole fetch, redirects included).",
    )
    media_max_redirects: int = Field(
        default=3,
        ge=0,
        description="Most redirects followed when fetching an image URL (each hop checked again).",
    )
    max_image_bytes: int = Field(
        default=20 * 1024 * 1024,
        ge=1,
        description="Largest image, in bytes: a download stops past it, a data: URI or base64 block "
        "is refused above it (requests are also bounded by max_body_bytes).",
    )
    max_images_per_request: int = Field(default=16, ge=0, description="Most images one request may carry.")
    max_image_pixels: int = Field(
        default=7680 * 4320,
        ge=1,
        description="Largest image, in pixels (width x height), read from its header before "
        "decoding (decompression bombs).",
    )

    @field_validator("state_url")
    @classmethod
    def _state_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{value!r} is not a redis://HOST:PORT/DB (or rediss://, unix://) URL")
        return value

    @field_validator("key_rate_limits", mode="before")
    @classmethod
    def _key_limit_specs(cls, value: Any) -> Any:
        return _spec_entries(value, ServedModel.spec_fields)

    @model_validator(mode="after")
    def _state_backends(self) -> Settings:
        # A state server holds stored responses too, unless a store was chosen.
        if self.state_url is not None and "response_store" not in self.model_fields_set:
            self.response_store = "redis"
            # Still not set by the user: a config file's choice may override it (Settings.load).
            self.__pydantic_fields_set__.discard("response_store")
        if self.response_store == "redis" and self.state_url is None:
            raise ValueError("response_store redis needs state_url (redis://HOST:PORT/DB)")
        if self.key_rate_limits:
            accepted = set(self.accepted_keys())
            for limit in self.key_rate_limits:
                if limit.key not in accepted:
                    raise ValueError(
                        "key_rate_limits: a key with limits is not one of the accepted API keys "
                        "(api_keys, api_key_file)"
                    )
        return self

    @field_validator("response_store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        from gateway.store import STORES

        if value not in STORES:
            raise ValueError(f"unknown response store {value!r}; expected one of {', '.join(STORES)}")
        return value

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _lora_specs(cls, value: Any) -> Any:
        if isinstance(value, (dict, LoraModule)):
            value = [value]
        return _spec_entries(value, LoraModule.spec_fields)

    @model_validator(mode="after")
    def _lora_bases(self) -> Settings:
        names = {m.name for m in self.models}
        seen: set[str] = set()
        for adapter in self.lora_modules:
            if adapter.name in names or adapter.name in seen:
                raise ValueError(f"LoRA adapter name {adapter.name!r} is already a model or adapter name")
            seen.add(adapter.name)
            # `gateway dev` gives its model later; the app checks the base again then.
            if self.models and adapter.base is not None and adapter.base not in names:
                raise ValueError(
                    f"LoRA adapter {adapter.name!r}: base {adapter.base!r} is not a served model"
                )
            if self.models and adapter.base is None and len(self.models) > 1:
                raise ValueError(f"LoRA adapter {adapter.name!r}: name its base model (several are served)")
        if self.lora_dynamic_roots and not self.admin_api_keys:
            raise ValueError("lora_dynamic_roots needs admin_api_keys (loading adapters is an admin action)")
        return self

    def lora_base(self, adapter: LoraModule) -> str:
        """The served model an adapter adapts."""
        if adapter.base is not None:
            return adapter.base
        if len(self.models) != 1:
            raise ValueError(f"LoRA adapter {adapter.name!r}: name its base model (base=MODEL)")
        return self.models[0].name

    @field_validator(*_URL_CHECKS)
    @classmethod
    def _check_urls(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if info.field_name == "triton_url" and not value:
            raise ValueError("at least one Triton URL is needed")
        check = _URL_CHECKS[str(info.field_name)]
        return [check(u) for u in value]

    @field_validator("objective_priorities", mode="before")
    @classmethod
    def _split_objectives(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        pairs = _split_env(value, item=_objective_priority, json_opens="{")
        return dict(pairs) if isinstance(pairs, list) else pairs

    @model_validator(mode="after")
    def _http_urls_pair_with_grpc_urls(self) -> Settings:
        if self.triton_http_url and len(self.triton_http_url) != len(self.triton_url):
            raise ValueError(
                f"--triton-http-url gives {len(self.triton_http_url)} endpoint(s) for "
                f"{len(self.triton_url)} --triton-url: give one HTTP URL per Triton, in the same order"
            )
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("models", mode="before")
    @classmethod
    def _model_specs(cls, value: Any) -> Any:
        # The environment and YAML take the flag's own syntax too: `name=a,tokenizer=/a; name=b,...`.
        if isinstance(value, (dict, ServedModel)):
            value = [value]
        return _spec_entries(value, ServedModel.spec_fields)

    @field_validator("models")
    @classmethod
    def _unique_names(cls, value: list[ServedModel]) -> list[ServedModel]:
        seen: set[str] = set()
        for model in value:
            if model.name in seen:
                raise ValueError(f"model name {model.name!r} is configured twice; each name must be unique")
            seen.add(model.name)
        return value

    @field_validator("api_key_file")
    @classmethod
    def _key_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None:
            if not value.is_file():
                raise ValueError(f"{value}: no such file")
            read_key_file(value)
        return value

    def accepted_keys(self) -> list[str]:
        keys = list(self.api_keys)
        if self.api_key_file is not None:
            keys += list(read_key_file(self.api_key_file))
        return keys

    def key_limits(self) -> dict[str, KeyRateLimit]:
        """Each key's own rate limits: from the key file (`rpm=N`, `tpm=N` after the key), where
        key_rate_limits does not give that key's."""
        limits: dict[str, KeyRateLimit] = {}
        if self.api_key_file is not None:
            for key, options in read_key_entries(self.api_key_file).items():
                if "rpm" in options or "tpm" in options:
                    limits[key] = KeyRateLimit(key=key, rpm=options.get("rpm"), tpm=options.get("tpm"))
        limits.update({limit.key: limit for limit in self.key_rate_limits})
        return limits

    def key_priorities(self) -> dict[str, int]:
        """Each key's default priority from the key file, where it gives one."""
        if self.api_key_file is None:
            return {}
        entries = read_key_file(self.api_key_file)
        return {key: priority for key, priority in entries.items() if priority is not None}

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Flags (overrides) win over the environment, which wins over the YAML file."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        env_only = cls(**overrides)
        if env_only.config_file is None:
            return env_only
        path = env_only.config_file
        data = read_config_file(path)
        explicit = env_only.model_dump(exclude_unset=True)
        try:
            return cls(**{**data, **explicit})
        except ValidationError as exc:
            raise ConfigFileError(path, exc, keys=set(data) - set(explicit)) from None


class ConfigFileError(ValueError):
    """Settings from a YAML file that do not validate; the message names the file."""

    def __init__(self, path: Path, error: ValidationError, *, keys: set[str]) -> None:
        super().__init__(f"{path}: {error}")
        self.path = path
        self.error = error
        self.keys = keys


# Options a key file line may give after the key, and the least value each takes.
KEY_OPTIONS: dict[str, int | None] = {"priority": None, "rpm": 1, "tpm": 1}


def read_key_entries(path: Path) -> dict[str, dict[str, int]]:
    """The API key file: one key per line, optionally followed by `priority=N` (the key's requests'
    default priority, vLLM's convention: lower is more urgent) and its own rate limits `rpm=N`,
    `tpm=N`; blank lines and `#` comments skipped. A ValueError names the line of anything else."""
    keys: dict[str, dict[str, int]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read ({exc})") from None
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, *options = text.split()
        values: dict[str, int] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if name not in KEY_OPTIONS or not sep:
                raise ValueError(
                    f"{path} line {number}: expected `KEY` or `KEY priority=N` (and `rpm=N`, `tpm=N`), "
                    f"not {option!r} after the key"
                )
            try:
                values[name] = int(value)
            except ValueError:
                raise ValueError(f"{path} line {number}: {name} must be an integer, not {value!r}") from None
            least = KEY_OPTIONS[name]
            if least is not None and values[name] < least:
                raise ValueError(f"{path} line {number}: {name} must be at least {least}, not {value!r}")
        keys[key] = values
    return keys


def read_key_file(path: Path) -> dict[str, int | None]:
    """Each key of the key file with its default priority (None where it gives none)."""
    return {key: options.get("priority") for key, options in read_key_entries(path).items()}


def read_config_file(path: Path) -> dict[str, Any]:
    """The YAML file's settings, or a ValueError naming the file (and the line of a syntax error)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--config-file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--config-file {path}: cannot be read ({exc})") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{path}: YAML syntax error{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of settings at the top level")
    if "model" in data:
        # `model:` reads naturally for one model; `models:` is the setting's own name.
        if "models" in data:
            raise ValueError(f"{path}: give either `model:` or `models:`, not both")
        data["models"] = data.pop("model")
    return data


def describe(error: ValidationError, *, path: Path | None = None, file_keys: Collection[str] = ()) -> str:
    """A settings error as one line naming each bad setting as the user gave it: its flag and
    environment variable, or its key in the YAML file."""
    parts = []
    for e in error.errors(include_url=False):
        loc = e.get("loc", ())
        field = str(loc[0]) if loc else ""
        if path is not None and field in file_keys:
            where = f"{path}: `{field}`"
        elif field in Settings.model_fields:
            where = f"{flag_name(field)} ({env_name(field)})"
        else:
            where = f"`{field}`"
        if e["type"] == "extra_forbidden" and len(loc) == 1:
            prefix = f"{path}: " if path is not None and field in file_keys else ""
            parts.append(f"{prefix}unknown setting {field!r}")
            continue
        inner = [str(p + 1) if isinstance(p, int) else str(p) for p in loc[1:]]
        if field == "models" and inner:
            where += f" model {inner[0]}" + (f" `{'.'.join(inner[1:])}`" if inner[1:] else "")
        elif inner:
            where += f" [{'.'.join(inner)}]"
        message = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
        value = e.get("input")
        if e["type"] == "extra_forbidden":
            message = "unknown key"
        elif not e["type"].startswith("value_error") and isinstance(value, (str, int, float)):
            message += f" (got {value!r})"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)
