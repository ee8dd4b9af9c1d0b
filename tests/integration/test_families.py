"""The real families (deploy.families) through every API and route, against transformers.

Each family's tiny model is served on the session's Triton; every answer is compared with what
transformers generates greedily for the same rendered prompt: the prompt's ids (a chat template's
text encoded as `apply_chat_template(tokenize=True)` encodes it: no special tokens on top of what the
template writes; a raw prompt with the tokenizer's default), the text (the tokenizer's own decoding
of the generated ids), the usage counts, stop strings and log probabilities.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.families import FAMILIES
from tests.integration.conftest import TritonStack, family_model_spec, family_routes
from tests.support import http_client
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

MAX_TOKENS = 16
MESSAGES = [{"role": "user", "content": "Tell me about 你好, café and 🙂, please."}]
RAW_PROMPT = "Once upon a time in 東京 🚀"
# The bytes of 🙂 and of 你: steering a byte-fallback model onto its <0xNN> pieces.
BYTE_PIECES = ("<0xF0>", "<0x9F>", "<0x99>", "<0x82>", "<0xE4>", "<0xBD>", "<0xA0>")


@pytest.fixture(scope="module")
def gateway(triton_stack: TritonStack) -> Iterator[GatewayProcess]:
    args = ["--triton-url", triton_stack.grpc_url, "--log-level", "warning"]
    for family in FAMILIES:
        for route in family_routes(triton_stack, family):
            args += ["--model", family_model_spec(triton_stack, family, route=route)]
    with GatewayProcess(args) as process:
        yield process


@dataclass(frozen=True, slots=True)
class Reference:
    prompt_ids: list[int]
    ids: list[int]
    text: str


class Transformers:
    """One family's tokenizer and model in this process: the reference answers."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        self.model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir))
        self.model.eval()

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def generate(self, prompt_ids: list[int], *, bias: dict[int, float] | None = None) -> Reference:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        class Bias(LogitsProcessor):
            def __call__(self, input_ids: Any, scores: Any) -> Any:
                for token, value in (bias or {}).items():
                    scores[:, token] += value
                return scores

        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                logits_processor=LogitsProcessorList([Bias()]) if bias else None,
            )
        ids = [int(i) for i in out[0, len(prompt_ids) :]]
        ends = set(self.model.generation_config.eos_token_id)
        text_ids = ids[:-1] if ids and ids[-1] in ends else ids
        return Reference(prompt_ids, ids, self.tokenizer.decode(text_ids, skip_special_tokens=True))


@cache
def transformers_of(model_dir: Path) -> Transformers:
    return Transformers(model_dir)


def reference(stack: TritonStack, family: str) -> Transformers:
    return transformers_of(stack.models[f"family_{family}"].tokenizer_dir)


def _sse(response: httpx.Response) -> list[dict[str, Any]]:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line.removeprefix("data: ")))
    return events


def ask(base: str, api: str, model: str, *, stream: bool, **extra: Any) -> tuple[str, int, int]:
    """One greedy request: (text, prompt tokens, completion tokens) as the API reports them."""
    if api == "chat":
        path, body = "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": MAX_TOKENS}
    elif api == "completions":
        path, body = "/v1/completions", {"prompt": RAW_PROMPT, "max_tokens": MAX_TOKENS}
    elif api == "responses":
        path, body = "/v1/responses", {"input": MESSAGES[0]["content"], "max_output_tokens": MAX_TOKENS}
    else:
        path, body = "/v1/messages", {"messages": MESSAGES, "max_tokens": MAX_TOKENS}
    body = {"model": model, "temperature": 0, "stream": stream, **body, **extra}
    if stream and api in ("chat", "completions"):
        body["stream_options"] = {"include_usage": True}
    with http_client.stream("POST", base + path, json=body, timeout=120) as r:
        if r.status_code != 200:
            r.read()
            raise AssertionError(f"{api} {model}: {r.status_code} {r.text}")
        if not stream:
            r.read()
            return _whole(api, r.json())
        return _streamed(api, _sse(r))


def _whole(api: str, data: dict[str, Any]) -> tuple[str, int, int]:
    if api == "chat":
        u = data["usage"]
        return data["choices"][0]["message"]["content"] or "", u["prompt_tokens"], u["completion_tokens"]
    if api == "completions":
        u = data["usage"]
        return data["choices"][0]["text"], u["prompt_tokens"], u["completion_tokens"]
    if api == "responses":
        text = "".join(
            part["text"]
            for item in data["output"]
            if item["type"] == "message"
            for part in item["content"]
            if part["type"] == "output_text"
        )
        return text, data["usage"]["input_tokens"], data["usage"]["output_tokens"]
    text = "".join(block["text"] for block in data["content"] if block["type"] == "text")
    return text, _anthropic_input(data["usage"]), data["usage"]["output_tokens"]


def _anthropic_input(usage: dict[str, Any]) -> int:
    # Anthropic's input_tokens leave out the prompt tokens read from the cache.
    return int(usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0))


def _streamed(api: str, events: list[dict[str, Any]]) -> tuple[str, int, int]:
    if api in ("chat", "completions"):
        text = "".join(
            (c["delta"].get("content") or "") if api == "chat" else c["text"]
            for e in events
            for c in e["choices"]
        )
        usage = events[-1]["usage"]
        return text, usage["prompt_tokens"], usage["completion_tokens"]
    if api == "responses":
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        # A reply cut by max_output_tokens ends incomplete, as OpenAI's do.
        final = ("response.completed", "response.incomplete")
        done = next(e for e in events if e["type"] in final)["response"]["usage"]
        return text, done["input_tokens"], done["output_tokens"]
    text = "".join(
        e["delta"]["text"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    end = [e for e in events if e["type"] == "message_delta"][-1]["usage"]
    return text, _anthropic_input(start), end["output_tokens"]


def special_texts(ref: Transformers) -> list[str]:
    return [t for t in ref.tokenizer.all_special_tokens if t]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_api_and_route_answers_as_transformers(
    family: str, gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    ref = reference(triton_stack, family)
    chat = ref.generate(ref.chat_ids(MESSAGES))
    raw = ref.generate(ref.tokenizer.encode(RAW_PROMPT))
    specials = special_texts(ref)
    for route in family_routes(triton_stack, family):
        model = f"{family}-{route}"
        # The ids a chat request sends, as /tokenize shows them: transformers' own.
        for body, ids in (
            ({"messages": MESSAGES}, chat.prompt_ids),
            ({"prompt": RAW_PROMPT}, raw.prompt_ids),
        ):
            shown = http_client.post(
                gateway.base_url + "/tokenize", json={"model": model, **body}, timeout=60
            )
            assert shown.json()["tokens"] == ids, (model, body)
        for api in ("chat", "completions", "responses", "messages"):
            expected = raw if api == "completions" else chat
            for stream in (False, True):
                what = f"{model} {api} stream={stream}"
                text, prompt_tokens, completion_tokens = ask(gateway.base_url, api, model, stream=stream)
                assert text == expected.text, what
                assert prompt_tokens == len(expected.prompt_ids), what
                assert completion_tokens == len(expected.ids), what
                assert not any(s in text for s in specials), what


def _chat(base: str, model: str, *, stream: bool, **extra: Any) -> tuple[str, str, list[dict[str, Any]]]:
    """(content, finish reason, logprobs content entries) of one greedy chat request."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
    if not stream:
        r = http_client.post(base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return (
            choice["message"]["content"] or "",
            choice["finish_reason"],
            (choice["logprobs"] or {}).get("content") or [],
        )
    text, finish, entries = "", "", []
    with http_client.stream(
        "POST", base + "/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        for event in _sse(r):
            for c in event["choices"]:
                text += c["delta"].get("content") or ""
                finish = c["finish_reason"] or finish
                entries += (c.get("logprobs") or {}).get("content") or []
    return text, finish, entries


def _stopped(base: str, api: str, model: str, *, stream: bool, stop: str) -> tuple[str, Any]:
    """(text, how the API says the reply ended) of one greedy request with one stop string."""
    extra: dict[str, Any] = {"stop_sequences": [stop]} if api == "messages" else {"stop": [stop]}
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": MAX_TOKENS}),
        "completions": ("/v1/completions", {"prompt": RAW_PROMPT, "max_tokens": MAX_TOKENS}),
        "responses": ("/v1/responses", {"input": MESSAGES[0]["content"], "max_output_tokens": MAX_TOKENS}),
        "messages": ("/v1/messages", {"messages": MESSAGES, "max_tokens": MAX_TOKENS}),
    }[api]
    body = {"model": model, "temperature": 0, "stream": stream, **body, **extra}
    if not stream:
        r = http_client.post(base + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        if api == "messages":
            text = "".join(b["text"] for b in data["content"] if b["type"] == "text")
            return text, (data["stop_reason"], data["stop_sequence"])
        if api == "responses":
            return _whole(api, data)[0], (data["status"], data["incomplete_details"])
        choice = data["choices"][0]
        text = (choice["message"]["content"] or "") if api == "chat" else choice["text"]
        return text, choice["finish_reason"]
    with http_client.stream("POST", base + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        events = _sse(r)
    if api == "responses":
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        done = next(e for e in events if e["type"] in ("response.completed", "response.incomplete"))
        return text, (done["response"]["status"], done["response"]["incomplete_details"])
    if api == "messages":
        text = "".join(
            e["delta"]["text"]
            for e in events
            if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
        )
        end = [e for e in events if e["type"] == "message_delta"][-1]["delta"]
        return text, (end["stop_reason"], end["stop_sequence"])
    text = "".join(
        (c["delta"].get("content") or "") if api == "chat" else c["text"]
        for e in events
        for c in e["choices"]
    )
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    return text, finish[-1]


# How each API says a stop string ended the reply.
STOPPED: dict[str, Any] = {
    "chat": lambda stop: "stop",
    "completions": lambda stop: "stop",
    "responses": lambda stop: ("completed", None),
    "messages": lambda stop: ("stop_sequence", stop),
}


@pytest.mark.parametrize("api", list(STOPPED))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_stop_strings_cut_exactly(
    family: str, api: str, gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    ref = reference(triton_stack, family)
    expected = (
        ref.generate(ref.tokenizer.encode(RAW_PROMPT))
        if api == "completions"
        else ref.generate(ref.chat_ids(MESSAGES))
    ).text
    # A stop string from the middle of the answer, where it first occurs: the text ends before it.
    at = max(1, len(expected) // 2)
    stop = expected[at : at + 2]
    at = expected.index(stop)
    for route in family_routes(triton_stack, family):
        model = f"{family}-{route}"
        for stream in (False, True):
            got = _stopped(gateway.base_url, api, model, stream=stream, stop=stop)
            assert got == (expected[:at], STOPPED[api](stop)), (model, stream, stop)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logprob_bytes_are_the_content(
    family: str, gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    ref = reference(triton_stack, family)
    expected = ref.generate(ref.chat_ids(MESSAGES)).text
    for stream in (False, True):
        # The first token's bytes included: where the text drops a SentencePiece answer's leading
        # space, its log probability's bytes drop it too.
        text, _, entries = _chat(gateway.base_url, f"{family}-engine", stream=stream, logprobs=True)
        assert text == expected
        joined = b"".join(bytes(e["bytes"]) for e in entries)
        # Exact bytes, where a random model's partial characters never complete: the text has
        # the replacement character the tokenizer's decoding puts there.
        assert joined.decode("utf-8", "replace") == text, (family, stream)
        assert "\ufffd" in text or joined == text.encode()
        # A token that is not whole characters is named by its bytes, as OpenAI names it.
        for e in entries:
            raw = bytes(e["bytes"])
            named = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            assert e["token"] == (named if e["token"].startswith("bytes:") else raw.decode())


@pytest.mark.parametrize("family", [f for f, spec in FAMILIES.items() if spec.byte_fallback])
def test_byte_fallback_pieces_decode_as_the_tokenizer_decodes_them(
    family: str, gateway: GatewayProcess, triton_stack: TritonStack
) -> None:
    ref = reference(triton_stack, family)
    # Steered onto the byte pieces of 🙂 and 你: whole characters where they come in order,
    # replacement characters where they do not, exactly as the tokenizer's decoding has them.
    pieces = ref.tokenizer.convert_tokens_to_ids(list(BYTE_PIECES))
    bias = {int(i): 100.0 for i in pieces}
    expected = ref.generate(ref.chat_ids(MESSAGES), bias=bias)
    assert set(expected.ids) <= set(bias) | set(ref.model.generation_config.eos_token_id)
    model = f"{family}-engine"
    for stream in (False, True):
        text, _, entries = _chat(
            gateway.base_url, model, stream=stream, logit_bias={str(i): 100 for i in bias}, logprobs=True
        )
        assert text == expected.text, stream
        assert [bytes(e["bytes"]) for e in entries] == [
            bytes([int(p[3:5], 16)]) for p in ref.tokenizer.convert_ids_to_tokens(expected.ids)
        ]
