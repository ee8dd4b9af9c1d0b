"""What a model cannot do (the llmapi model: logprobs, guided decoding, a forced tool choice,
logit bias, ...) is a 400 naming the parameter, in the error shape of the API it was sent to."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anthropic
import openai
import pytest

from tests.support.anthropic_errors import assert_error
from tests.support.openai_schema import validate


@contextmanager
def openai_refusal(param: str) -> Iterator[None]:
    """The block's `openai` SDK call raises BadRequestError: an OpenAI error naming `param`."""
    with pytest.raises(openai.BadRequestError) as info:
        yield
    validate("ErrorResponse", info.value.response.json())
    assert info.value.response.json()["error"]["param"] == param, info.value.response.text


@contextmanager
def anthropic_refusal(param: str) -> Iterator[None]:
    """The block's `anthropic` SDK call raises BadRequestError: an Anthropic invalid request whose
    message names `param`."""
    with pytest.raises(anthropic.BadRequestError) as info:
        yield
    assert_error(info.value.response, 400, "invalid_request_error", message=param)
