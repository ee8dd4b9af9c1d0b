"""Wire models every OpenAI API here shares: the sampling fields of a generation request, usage,
the error body. Each API's own models live in its folder."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

# ---------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class GenerationFields(BaseModel):
    """Fields shared by completions and chat completions, plus the engine's own knobs."""

    # Unknown fields are accepted (clients send many); core.validation logs them once.
    # Python's JSON parser reads NaN and Infinity: no sampling knob may be either.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Fields OpenAI defines that change the result; rejected by name until supported.
    logprobs: Any = None
    logit_bias: dict[str, float] | None = None
    # TensorRT-LLM knobs, as vLLM accepts them in the body ("extra_body" in the SDK).
    # Sent as an INT32 tensor.
    top_k: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    length_penalty: float | None = None
    ignore_eos: bool | None = None


# ---------------------------------------------------------------- responses


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
