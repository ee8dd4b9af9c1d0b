"""Typed settings: flags, `GATEWAY_*` environment variables and an optional YAML file, in that order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.text.reasoning.registry import MODEL_FORMATS as REASONING_FORMATS
from gateway.text.tool_calls.registry import MODEL_FORMATS

Route = Literal["ensemble", "engine"]


class ServedModel(BaseModel):
    """One model as clients see it, and where it lives in Triton."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Model name clients send in `model`.")
    triton_model: str = Field(default="ensemble", description="Triton model the `ensemble` route calls.")
    engine_model: str = Field(
        default="tensorrt_llm", description="Triton model the `engine` route calls (token ids in and out)."
    )
    tokenizer: Path = Field(description="Local Hugging Face directory with the tokenizer (and its configs).")
    route: Route = Field(default="ensemble", description="`ensemble` (text in Triton) or `engine` (ids).")
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
    reasoning_parser: str = Field(
        default="none",
        description="How this model writes its thinking: "
        + " | ".join(REASONING_FORMATS)
        + " (none: the whole reply is the answer).",
    )
    add_special_tokens: bool = Field(
        default=True,
        description="Whether Triton's preprocessing adds special tokens (BOS); "
        "the gateway counts the same way.",
    )

    @field_validator("tool_parser")
    @classmethod
    def _registered_tool_parser(cls, value: str) -> str:
        if value not in MODEL_FORMATS:
            raise ValueError(f"tool_parser must be one of {', '.join(MODEL_FORMATS)}, not {value!r}")
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _registered_reasoning_parser(cls, value: str) -> str:
        if value not in REASONING_FORMATS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_FORMATS)}, not {value!r}")
        return value

    @classmethod
    def parse_spec(cls, spec: str) -> ServedModel:
        """`name=tiny,triton_model=ensemble,tokenizer=/models/tiny,route=ensemble` -> ServedModel."""
        fields: dict[str, Any] = {}
        for part in spec.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"model spec part {part!r} is not key=value")
            fields[key.strip()] = value.strip()
        return cls.model_validate(fields)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="forbid", env_nested_delimiter="__")

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=9000, ge=0, le=65535, description="Port to listen on.")
    workers: int = Field(default=1, ge=1, description="Worker processes sharing the port.")
    triton_url: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["127.0.0.1:8001"], description="Triton gRPC endpoint(s), HOST:PORT."
    )
    models: list[ServedModel] = Field(default_factory=list, description="Served models.")
    config_file: Path | None = Field(default=None, description="YAML file with any of these settings.")
    log_level: str = Field(default="info", description="Logging level.")
    log_format: Literal["text", "json"] = Field(default="text", description="Log lines as text or JSON.")
    access_log: bool = Field(default=True, description="One log line per request (never prompt text).")
    tracing: bool = Field(
        default=False,
        description="OpenTelemetry spans (needs the otel extra); OTLP exporter set by the OTEL_* variables.",
    )
    triton_connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Deadline for Triton metadata calls (config, readiness)."
    )
    readiness_cache_s: float = Field(
        default=1.0, ge=0, description="How long a Triton readiness answer is reused by /health/ready."
    )
    max_n: int = Field(default=16, ge=1, description="Largest `n` accepted.")
    max_stop_strings: int = Field(default=16, ge=0, description="Most stop strings per request.")
    max_stop_string_length: int = Field(default=256, ge=1, description="Longest stop string, in characters.")
    sse_ping_s: float = Field(default=15.0, ge=0, description="SSE keep-alive comment interval (0: off).")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Accepted API keys (comma-separated in the environment); none configured: no auth.",
    )
    api_key_file: Path | None = Field(default=None, description="File with one accepted API key per line.")
    protect_metrics: bool = Field(default=False, description="Require an API key for /metrics too.")
    cors_origins: Annotated[list[str], NoDecode] = Field(
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
    max_prompt_tokens: int | None = Field(default=None, ge=1, description="Largest prompt, in tokens.")
    max_tokens_limit: int | None = Field(
        default=None, ge=1, description="Largest max_tokens a request may ask."
    )
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="Idle HTTP keep-alive, longer than clients' pool idle time (no reuse of a closing one).",
    )
    shutdown_grace_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long open streams may run before they are cancelled."
    )

    @field_validator("triton_url", "api_keys", "cors_origins", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        # Lists come from the environment as `a,b` (or JSON, as pydantic-settings writes them).
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [u.strip() for u in text.split(",") if u.strip()]
        return value

    def accepted_keys(self) -> list[str]:
        keys = list(self.api_keys)
        if self.api_key_file is not None:
            lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return keys

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Flags (overrides) win over the environment, which wins over the YAML file."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        env_only = cls(**overrides)
        if env_only.config_file is None:
            return env_only
        data = yaml.safe_load(env_only.config_file.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{env_only.config_file}: expected a mapping at the top level")
        explicit = env_only.model_dump(exclude_unset=True)
        return cls(**{**data, **explicit})
