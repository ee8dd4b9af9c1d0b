"""Prompt log probabilities against the real CPU engine, compared with transformers' log-softmax of
the same ids: echo with logprobs, max_tokens 0, vLLM's prompt_logprobs, and lm-evaluation-harness's
`local-completions` model class scoring through the gateway (offline: its Instances built here)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.conftest import TritonStack, llmapi_model_spec
from tests.support.gateway_process import GatewayProcess
from tests.support.tokenizers import loaded_tokenizer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    m = triton_stack.models["bpe_current"]
    specs = [
        f"name=tiny-engine,tokenizer={m.tokenizer_dir},route=engine,engine_model={m.engine}",
        f"name=tiny,tokenizer={m.tokenizer_dir},triton_model={m.ensemble},route=ensemble",
        llmapi_model_spec(triton_stack, "tiny-llmapi"),
    ]
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for spec in specs:
        args += ["--model", spec]
    with GatewayProcess(args) as process:
        yield process


@pytest.fixture(scope="module")
def model_dir(triton_stack: TritonStack) -> Path:
    return triton_stack.models["bpe_current"].tokenizer_dir


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0) as client:
        yield client


@cache
def _reference_model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def reference_rows(model_dir: Path, ids: Sequence[int]) -> Any:
    """transformers' log-softmax of every position ([len(ids), vocab], float64): row i predicts ids[i + 1]."""
    import torch

    with torch.no_grad():
        logits = _reference_model(model_dir)(torch.tensor([list(ids)])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(
    sdk: openai.OpenAI, model_dir: Path
) -> None:

    tok = loaded_tokenizer(model_dir)
    ids = tok.encode("The quick brown fox jumps over", add_special_tokens=False)
    out = sdk.completions.create(model="tiny-engine", prompt=ids, max_tokens=0, echo=True, logprobs=2)
    (choice,) = out.choices
    assert choice.finish_reason == "length"
    assert choice.text == tok.decode(ids, skip_special_tokens=False)
    assert out.usage is not None and out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 0
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.token_logprobs) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    rows = reference_rows(model_dir, ids)
    for pos in range(1, len(ids)):
        assert math.isclose(lp.token_logprobs[pos], rows[pos - 1, ids[pos]].item(), abs_tol=1e-4)
        best = rows[pos - 1].topk(2).values.tolist()
        assert sorted(lp.top_logprobs[pos].values(), reverse=True) == pytest.approx(best, abs=1e-4)
        # A chosen token that is the most likely equals that alternative exactly (lm-eval's is_greedy).
        if ids[pos] == rows[pos - 1].argmax().item():
            assert lp.token_logprobs[pos] == max(lp.top_logprobs[pos].values())

    # With generation: the prompt's entries, then the completion's, on one text.
    more = sdk.completions.create(
        model="tiny-engine", prompt=ids, max_tokens=3, echo=True, logprobs=1, temperature=0
    )
    lp2 = more.choices[0].logprobs
    assert lp2 is not None and lp2.token_logprobs is not None and lp2.text_offset is not None
    assert len(lp2.token_logprobs) == len(ids) + 3
    assert lp2.token_logprobs[: len(ids)] == pytest.approx(lp.token_logprobs, abs=1e-6)
    assert lp2.text_offset[len(ids)] == len(choice.text)
    assert more.choices[0].text.startswith(choice.text)


def test_vllm_prompt_logprobs_on_chat_equal_transformers(sdk: openai.OpenAI, model_dir: Path) -> None:

    tok = loaded_tokenizer(model_dir)
    messages = [{"role": "user", "content": "Name a colour."}]
    out = sdk.chat.completions.create(
        model="tiny-engine",
        messages=messages,
        max_tokens=2,
        extra_body={"prompt_logprobs": 1},  # type: ignore[arg-type]
    )
    prompt = out.model_extra["prompt_logprobs"]  # type: ignore[index]
    ids = tok.encode(tok.apply_chat_template(messages))
    assert len(prompt) == len(ids) and prompt[0] is None
    rows = reference_rows(model_dir, ids)
    for pos in range(1, len(ids)):
        entry = prompt[pos][str(ids[pos])]
        assert math.isclose(entry["logprob"], rows[pos - 1, ids[pos]].item(), abs_tol=1e-4)
        assert entry["rank"] == int((rows[pos - 1] > rows[pos - 1, ids[pos]]).sum()) + 1


@pytest.mark.parametrize("model", ["tiny-llmapi", "tiny"])
def test_models_that_cannot_score_the_prompt_refuse_naming_the_field(sdk: openai.OpenAI, model: str) -> None:
    """The llmapi model returns no context logits; the ensemble tokenizes the text again."""
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(model=model, prompt="Hello there", max_tokens=1, echo=True, logprobs=1)
    assert caught.value.body["param"] == "echo"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(
            model=model, prompt="Hello there", max_tokens=1, extra_body={"prompt_logprobs": 0}
        )
    assert caught.value.body["param"] == "prompt_logprobs"  # type: ignore[index]


# A small multiple-choice set: (context, options); the random model has no idea, so the point is
# that the options get distinct scores equal to transformers' (no longer 0.0 each, ties won by the first).
QUESTIONS = [
    ("Question: What colour is the sky?\nAnswer:", [" blue", " green", " red", " yellow"]),
    ("Question: How many legs has a cat?\nAnswer:", [" four", " two", " six", " eight"]),
    ("Question: Which is a fruit?\nAnswer:", [" apple", " stone", " chair", " cloud"]),
]


@pytest.fixture(scope="module")
def lm(gateway: GatewayProcess, model_dir: Path) -> Any:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI(
        base_url=gateway.base_url + "/v1/completions",
        model="tiny-engine",
        tokenizer_backend="huggingface",
        tokenizer=str(model_dir),
        batch_size=4,
        max_retries=1,
    )


def _reference_score(model_dir: Path, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    ids = context + continuation
    rows = reference_rows(model_dir, ids)
    positions = range(len(context), len(ids))
    total = sum(rows[p - 1, ids[p]].item() for p in positions)
    greedy = all(rows[p - 1].argmax().item() == ids[p] for p in positions)
    return total, greedy


def test_lm_eval_loglikelihood_equals_transformers_and_multiple_choice_is_not_won_by_ties(
    lm: Any, model_dir: Path
) -> None:
    from lm_eval.api.instance import Instance

    pairs = [(context, option) for context, options in QUESTIONS for option in options]
    instances = [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i) for i, pair in enumerate(pairs)
    ]
    results = lm.loglikelihood(instances, disable_tqdm=True)
    assert len(results) == len(pairs)
    for (context, continuation), (score, is_greedy) in zip(pairs, results, strict=True):
        context_enc, continuation_enc = lm._encode_pair(context, continuation)
        expected, expected_greedy = _reference_score(model_dir, context_enc, continuation_enc)
        assert score == pytest.approx(expected, abs=1e-3), (context, continuation)
        assert is_greedy == expected_greedy, (context, continuation)
    # The model's own greedy continuation, as ids (its text need not encode back to the same ids):
    # is_greedy true, through the same request lm-eval builds for every loglikelihood.
    context_ids = lm.tok_encode(QUESTIONS[0][0])
    first = int(reference_rows(model_dir, context_ids)[-1].argmax())
    second = int(reference_rows(model_dir, [*context_ids, first])[-1].argmax())
    ((score, is_greedy),) = lm._loglikelihood_tokens(
        [(("", ""), context_ids, [first, second])], disable_tqdm=True
    )
    expected, expected_greedy = _reference_score(model_dir, context_ids, [first, second])
    assert expected_greedy and is_greedy
    assert score == pytest.approx(expected, abs=1e-3)
    # Multiple choice: each question's options score apart, and the pick is transformers' pick.
    for q, (_, options) in enumerate(QUESTIONS):
        scores = [score for score, _ in results[q * len(options) : (q + 1) * len(options)]]
        assert len(set(scores)) == len(scores)
        assert all(s < 0 for s in scores)
        expected = [
            _reference_score(model_dir, *lm._encode_pair(QUESTIONS[q][0], option))[0] for option in options
        ]
        assert scores.index(max(scores)) == expected.index(max(expected))
