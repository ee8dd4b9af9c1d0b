"""Beyond the peers, against the real CPU engine: structured output, tool calls, logprobs."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import jsonschema
import openai
import pydantic
import pytest

from tests.integration.conftest import TritonStack
from tests.support.gateway_process import GatewayProcess
from tests.support.tokenizers import loaded_tokenizer

pytestmark = pytest.mark.integration

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    m = triton_stack.models["bpe_current"]
    specs = [
        f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.ensemble},route=ensemble,tool_parser=hermes",
        f"name=tiny-engine,tokenizer={m.tokenizer_dir},route=engine,engine_model={m.engine},tool_parser=hermes",
    ]
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for spec in specs:
        args += ["--model", spec]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(pattern="^[A-Z][a-z]{1,8}$")
    celsius: int = pydantic.Field(ge=-30, le=45)
    sunny: bool
    tags: list[str] = pydantic.Field(max_length=2)


@pytest.mark.parametrize("model", ["tiny", "tiny-engine"])
def test_the_sdk_parse_helper_returns_an_object_from_guided_decoding(sdk: openai.OpenAI, model: str) -> None:
    out = sdk.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Forecast for Paris?"}],
        response_format=Forecast,
        max_tokens=200,
        temperature=0,
    )
    parsed = out.choices[0].message.parsed
    assert isinstance(parsed, Forecast)
    assert out.choices[0].finish_reason == "stop"


def test_json_schema_output_validates_for_sampled_choices(sdk: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
            "size": {"type": "string", "enum": ["s", "m", "l"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "size", "count"],
        "additionalProperties": False,
    }
    out = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Describe an item"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "item", "schema": schema, "strict": True},
        },
        n=3,
        temperature=1.0,
        seed=3,
        max_tokens=120,
    )
    for choice in out.choices:
        jsonschema.validate(json.loads(choice.message.content or ""), schema)


def test_langchain_binds_tools_calls_one_and_answers_from_the_result(gateway: GatewayProcess) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=gateway.base_url + "/v1", api_key="unused", model="tiny", temperature=0, max_tokens=60
    )
    # tool_choice forces a call; guided decoding makes even the random test model write a valid one.
    with_tools = llm.bind_tools([WEATHER], tool_choice="get_weather")
    history = [HumanMessage("What is the weather in Paris?")]
    ai = with_tools.invoke(history)
    assert ai.tool_calls, ai
    call = ai.tool_calls[0]
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Tokyo")
    assert ai.response_metadata["finish_reason"] == "tool_calls"
    history += [ai, ToolMessage(content="21 C and sunny", tool_call_id=call["id"])]
    answer = llm.bind_tools([WEATHER]).invoke(history)
    assert answer.response_metadata["finish_reason"] in ("stop", "length")
    assert not answer.tool_calls
    # Streaming the forced call gives the same call, assembled from OpenAI-style deltas.
    chunks = list(with_tools.stream(history[:1]))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.tool_calls[0]["name"] == "get_weather"


def reference_logprobs(model_dir, prompt_ids: list[int], generated: list[int]) -> list[list[float]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated])).logits[0]
    logsoftmax = torch.log_softmax(logits.double(), dim=-1)
    rows = logsoftmax[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(generated)]
    return rows.tolist()


@pytest.mark.parametrize("model", ["tiny", "tiny-engine"])
def test_logprobs_equal_the_reference_models_log_softmax(
    sdk: openai.OpenAI, triton_stack: TritonStack, model: str
) -> None:
    from gateway.apis.openai.logprobs import token_string

    m = triton_stack.models["bpe_current"]
    tok = loaded_tokenizer(m.tokenizer_dir)
    prompt = "The quick brown fox"
    out = sdk.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=3, extra_body={"ignore_eos": True}
    )
    lp = out.choices[0].logprobs
    assert (
        lp is not None
        and lp.tokens is not None
        and lp.token_logprobs is not None
        and lp.top_logprobs is not None
    )
    assert len(lp.tokens) == 12
    # Re-tokenizing token texts is ambiguous; the engine's own ids come from the chat route below.
    chat = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 12
    prompt_ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]))
    # Greedy: the chosen token is the best alternative, so its id is the argmax of the reference.
    rows = None
    generated: list[int] = []
    for _ in range(12):
        rows = reference_logprobs(m.tokenizer_dir, prompt_ids, [*generated, 0])
        generated.append(max(range(len(rows[-1])), key=rows[-1].__getitem__))
    rows = reference_logprobs(m.tokenizer_dir, prompt_ids, generated)
    for pos, entry in enumerate(content):
        # Named as OpenAI does (`bytes:\xNN` for a partial character), with its exact bytes.
        text, raw = token_string(tok, generated[pos])
        assert entry.token == text and bytes(entry.bytes or []) == raw
        assert math.isclose(entry.logprob, rows[pos][generated[pos]], abs_tol=1e-4)
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        best = sorted(rows[pos], reverse=True)[:5]
        assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(tops, best, strict=True))


def test_logit_bias_on_the_engine_route_forces_a_token_and_is_refused_on_the_ensemble(
    sdk: openai.OpenAI, triton_stack: TritonStack
) -> None:

    tok = loaded_tokenizer(triton_stack.models["bpe_current"].tokenizer_dir)
    (token,) = tok.encode(" the", add_special_tokens=False)[:1]
    out = sdk.completions.create(
        model="tiny-engine",
        prompt="Once",
        max_tokens=5,
        temperature=0,
        logit_bias={str(token): 100},
        extra_body={"ignore_eos": True},
    )
    assert out.choices[0].text == tok.decode([token] * 5)
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model="tiny", prompt="Once", max_tokens=5, logit_bias={str(token): 100})
    assert info.value.body["param"] == "logit_bias"  # type: ignore[index]
