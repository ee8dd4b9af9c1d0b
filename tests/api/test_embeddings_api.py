"""/v1/embeddings, /v1/rerank and /v1/score on the app with scripted encoders: pooling and
normalizing as the model's files say, Matryoshka dimensions, batching, truncation, keys, rate
limits and metrics as for generation, and every hostile input a 4xx in OpenAI's shape."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sse_starlette.sse import AppStatus

from gateway.app import create_app
from gateway.config import ServedModel, Settings
from gateway.text.encoding import INLINE_CHARS
from gateway.text.tokenizer import Tokenizer
from tests.support.fake_encoder import FakeEncoder, pair_logit, token_state
from tests.support.fake_engine import FakeEngine
from tests.support.fixtures import tiny_bpe_dir, tiny_embed_dir, tiny_score_dir  # noqa: F401
from tests.support.openai_schema import validate
from tests.support.tokenizers import loaded_tokenizer


class Served:
    def __init__(
        self,
        client: httpx.AsyncClient,
        encoders: dict[str, FakeEncoder],
        tokenizer: Tokenizer,
        score_dir: Path,
    ) -> None:
        self.score_dir = score_dir
        self.client = client
        self.encoders = encoders
        self.tokenizer = tokenizer


@pytest.fixture
async def served(
    request: pytest.FixtureRequest,
    tiny_bpe_dir: Path,  # noqa: F811
    tiny_embed_dir: Path,  # noqa: F811
    tiny_score_dir: Path,  # noqa: F811
) -> AsyncIterator[Served]:
    settings: dict[str, Any] = getattr(request, "param", {})
    AppStatus.should_exit = False
    encoders: dict[str, FakeEncoder] = {}

    def encoder_factory(model: ServedModel) -> FakeEncoder:
        encoder = FakeEncoder(scores=model.name == "rr", takes="text" if model.name == "emb-text" else "ids")
        encoders[model.name] = encoder
        return encoder

    config = Settings(
        models=[
            ServedModel(name="tiny", tokenizer=tiny_bpe_dir),
            ServedModel(name="emb", tokenizer=tiny_embed_dir),
            ServedModel(name="emb-text", tokenizer=tiny_embed_dir),
            ServedModel(name="rr", tokenizer=tiny_score_dir),
        ],
        **settings,
    )
    app = create_app(
        config,
        engine_factory=lambda m: FakeEngine(loaded_tokenizer(m.tokenizer)),  # type: ignore[arg-type,return-value]
        encoder_factory=encoder_factory,  # type: ignore[arg-type]
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            yield Served(client, encoders, loaded_tokenizer(tiny_embed_dir), tiny_score_dir)


def _expected(ids: list[int], size: int | None = None) -> np.ndarray:
    """Mean pooling and normalizing (the tiny encoder's sentence-transformers files), done here."""
    mean = np.mean([token_state(t, p).astype(np.float64) for p, t in enumerate(ids)], axis=0)
    vector = mean / np.linalg.norm(mean)
    if size is not None:
        vector = vector[:size] / np.linalg.norm(vector[:size])
    return vector


async def test_text_and_token_ids_are_pooled_and_normalized_as_the_model_says(served: Served) -> None:
    texts = ["Hello world", "The gateway embeds text", "a"]
    ids = [served.tokenizer.encode(t) for t in texts]
    for value in (texts, ids):
        r = await served.client.post("/v1/embeddings", json={"model": "emb", "input": value})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        for d, want in zip(body["data"], ids, strict=True):
            assert np.allclose(d["embedding"], _expected(want), atol=1e-6)
        assert body["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
        assert body["model"] == "emb" and body["object"] == "list"
        validate("CreateEmbeddingResponse", body)
    # Seven inputs go to the model in batches of its max batch size (3).
    await served.client.post("/v1/embeddings", json={"model": "emb", "input": texts * 2 + ["b"]})
    assert [len(b) for b in served.encoders["emb"].batches[-3:]] == [3, 3, 1]


async def test_base64_and_matryoshka_dimensions(served: Served) -> None:
    ids = served.tokenizer.encode("Hello world")
    body = {"model": "emb", "input": "Hello world", "encoding_format": "base64", "dimensions": 8}
    r = await served.client.post("/v1/embeddings", json=body)
    vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vector, _expected(ids, 8), atol=1e-6)
    r = await served.client.post("/v1/embeddings", json={**body, "dimensions": 12})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "dimensions"
    assert "32, 16, 8" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("declares", "dimensions", "status"),
    [
        ({}, 16, 400),
        ({}, 32, 200),
        ({"is_matryoshka": True}, 5, 200),
        ({"is_matryoshka": True}, 33, 400),
    ],
)
async def test_dimensions_follow_what_the_models_config_declares(
    tiny_embed_dir: Path,  # noqa: F811
    tmp_path: Path,
    declares: dict[str, Any],
    dimensions: int,
    status: int,
) -> None:
    """No Matryoshka declaration: only the model's own size (a 400 naming `dimensions` otherwise);
    `is_matryoshka`: any size up to it, the leading dimensions renormalized."""
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_embed_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    del config["matryoshka_dimensions"]
    (model_dir / "config.json").write_text(json.dumps({**config, **declares}))
    AppStatus.should_exit = False
    app = create_app(
        Settings(models=[ServedModel(name="emb", tokenizer=model_dir)]),
        encoder_factory=lambda m: FakeEncoder(),  # type: ignore[arg-type,return-value]
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            body = {"model": "emb", "input": "Hello world", "dimensions": dimensions}
            r = await client.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "dimensions"
    else:
        ids = loaded_tokenizer(tiny_embed_dir).encode("Hello world")
        assert np.allclose(r.json()["data"][0]["embedding"], _expected(ids, dimensions), atol=1e-6)


async def test_a_text_model_gets_the_text_and_token_ids_as_their_text(served: Served) -> None:
    ids = served.tokenizer.encode("hello world")
    for value in ("hello world", ids):
        r = await served.client.post("/v1/embeddings", json={"model": "emb-text", "input": value})
        assert r.status_code == 200, r.text
    sent = served.encoders["emb-text"].batches
    assert [b[0].text for b in sent] == ["hello world", "hello world"]


async def test_add_special_tokens_false_embeds_a_text_without_them(served: Served) -> None:
    """vLLM's add_special_tokens: the text's own tokens alone, as token ids would be sent."""
    ids = served.tokenizer.encode("Hello world", add_special_tokens=False)
    body = {"model": "emb", "input": "Hello world", "add_special_tokens": False}
    r = await served.client.post("/v1/embeddings", json=body)
    assert r.status_code == 200, r.text
    assert list(served.encoders["emb"].batches[-1][0].ids) == ids
    assert np.allclose(r.json()["data"][0]["embedding"], _expected(ids), atol=1e-6)
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    assert "x-gateway-ignored-fields" not in r.headers
    # A model that takes text tokenizes it itself: it cannot leave them out.
    r = await served.client.post("/v1/embeddings", json={**body, "model": "emb-text"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens"


async def test_truncate_prompt_tokens_cuts_and_a_long_input_is_a_400(served: Served) -> None:
    long = " ".join(["word"] * 300)
    r = await served.client.post("/v1/embeddings", json={"model": "emb", "input": long})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = await served.client.post(
        "/v1/embeddings", json={"model": "emb", "input": long, "truncate_prompt_tokens": 10}
    )
    assert r.status_code == 200, r.text
    sent = served.encoders["emb"].batches[-1][0].ids
    assert len(sent) == 10
    # The tokenizer's truncation: its special tokens stay at both ends.
    assert served.tokenizer.convert_ids_to_tokens([sent[0], sent[-1]]) == ["[CLS]", "[SEP]"]


async def test_rerank_and_score_apply_the_cross_encoders_sigmoid(served: Served) -> None:
    tokenizer = loaded_tokenizer(served.score_dir)
    docs = ["first document", "second one here", "third"]
    pairs = [tokenizer.encode_pair("query", d)[0] for d in docs]
    logits = np.array([pair_logit(p) for p in pairs])
    probs = 1 / (1 + np.exp(-logits))
    r = await served.client.post("/v1/rerank", json={"model": "rr", "query": "query", "documents": docs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == list(np.argsort(-probs))
    assert np.allclose([x["relevance_score"] for x in results], np.sort(probs)[::-1])
    r = await served.client.post(
        "/v2/rerank",
        json={"model": "rr", "query": "query", "documents": docs, "top_n": 1, "return_documents": False},
    )
    (only,) = r.json()["results"]
    assert only["index"] == int(np.argmax(probs)) and only["document"] is None
    assert only["relevance_score"] == pytest.approx(float(probs.max()))
    r = await served.client.post(
        "/v1/score", json={"model": "rr", "text_1": "query", "text_2": docs, "use_activation": False}
    )
    assert np.allclose([d["score"] for d in r.json()["data"]], logits)
    assert r.json()["usage"]["prompt_tokens"] == sum(map(len, pairs))
    r = await served.client.post("/score", json={"model": "rr", "text_1": ["query"] * 3, "text_2": docs})
    assert np.allclose([d["score"] for d in r.json()["data"]], probs)


async def test_rerank_and_score_take_vllms_other_names_and_name_back_ignored_fields(served: Served) -> None:
    tokenizer = loaded_tokenizer(served.score_dir)
    docs = ["first document", "second one here"]
    pairs = [tokenizer.encode_pair("query", d)[0] for d in docs]
    logits = [pair_logit(p) for p in pairs]
    tokens = sum(map(len, pairs))
    # vLLM's names for the two sides of a score request, and its older name for use_activation.
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        body = {"model": "rr", first: "query", second: docs, "softmax": False}
        r = await served.client.post("/v1/score", json=body)
        assert r.status_code == 200, r.text
        assert np.allclose([d["score"] for d in r.json()["data"]], logits)
        assert r.json()["usage"]["prompt_tokens"] == tokens
    r = await served.client.post("/v1/score", json={"model": "rr", "queries": "q", "text_2": docs})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text_1"
    r = await served.client.post(
        "/v1/score", json={"model": "rr", "text_1": "q", "text_2": docs, "documents": docs}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
    # Rerank: usage as vLLM gives it; a field of Cohere's the gateway does not use is named back,
    # a misspelt one refused.
    body = {"model": "rr", "query": "query", "documents": docs, "rank_fields": ["text"], "activation": False}
    r = await served.client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert r.headers["x-gateway-ignored-fields"] == "rank_fields"
    assert sorted(x["relevance_score"] for x in r.json()["results"]) == pytest.approx(sorted(logits))
    r = await served.client.post("/v1/rerank", json={**body, "return_document": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "return_document"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/embeddings", {"model": "emb", "input": []}, 400, "input"),
        ("/v1/embeddings", {"model": "emb", "input": ""}, 400, "input"),
        ("/v1/embeddings", {"model": "emb", "input": [[]]}, 400, "input"),
        ("/v1/embeddings", {"model": "emb", "input": ["a"] * 2049}, 400, "input"),
        ("/v1/embeddings", {"model": "emb", "input": [3, 99999]}, 400, "input"),
        ("/v1/embeddings", {"model": "emb", "input": [-1]}, 400, "input"),
        ("/v1/embeddings", {"model": "emb", "input": [1, "a"]}, 400, None),
        ("/v1/embeddings", {"model": "emb", "input": [True]}, 400, None),
        ("/v1/embeddings", {"model": "emb", "input": {"text": "a"}}, 400, None),
        ("/v1/embeddings", {"model": "emb", "input": "a", "encoding_format": "int8"}, 400, None),
        ("/v1/embeddings", {"model": "emb", "input": "a", "dimensions": 0}, 400, None),
        (
            "/v1/embeddings",
            {"model": "emb", "input": "a", "truncate_prompt_tokens": 1000},
            400,
            "truncate_prompt_tokens",
        ),
        ("/v1/embeddings", {"model": "tiny", "input": "a"}, 400, "model"),
        ("/v1/embeddings", {"model": "rr", "input": "a"}, 400, "model"),
        ("/v1/embeddings", {"model": "nope", "input": "a"}, 404, "model"),
        ("/v1/embeddings", {"input": "a"}, 400, None),
        (
            "/v1/chat/completions",
            {"model": "emb", "messages": [{"role": "user", "content": "x"}]},
            400,
            "model",
        ),
        ("/v1/completions", {"model": "rr", "prompt": "x"}, 400, "model"),
        ("/v1/rerank", {"model": "rr", "query": "q", "documents": []}, 400, "documents"),
        ("/v1/rerank", {"model": "rr", "query": "", "documents": ["d"]}, 400, "query"),
        ("/v1/rerank", {"model": "rr", "query": "q", "documents": [""]}, 400, "documents[0]"),
        ("/v1/rerank", {"model": "rr", "query": "q", "documents": [1]}, 400, None),
        ("/v1/rerank", {"model": "emb", "query": "q", "documents": ["d"]}, 400, "model"),
        ("/v1/score", {"model": "rr", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "text_1"),
        ("/v1/score", {"model": "tiny", "text_1": "a", "text_2": "b"}, 400, "model"),
    ],
)
async def test_hostile_inputs_are_4xx_in_openais_shape(
    served: Served, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = await served.client.post(path, json=body)
    assert r.status_code == status, r.text
    validate("ErrorResponse", r.json())
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["type"]
    if param is not None:
        assert error["param"] == param


async def test_a_hundred_thousand_inputs_are_refused_without_reaching_the_model(served: Served) -> None:
    r = await served.client.post("/v1/embeddings", json={"model": "emb", "input": ["x"] * 100_000})
    assert 400 <= r.status_code < 500
    assert "error" in r.json()
    assert served.encoders["emb"].batches == []


LONG = "word " * 600


@pytest.mark.parametrize(
    ("path", "long", "short"),
    [
        ("/v1/embeddings", {"model": "emb", "input": LONG}, {"model": "emb", "input": "short"}),
        (
            "/v1/rerank",
            {"model": "rr", "query": "q", "documents": [LONG]},
            {"model": "rr", "query": "q", "documents": ["d"]},
        ),
    ],
)
async def test_a_long_input_is_tokenized_without_holding_the_event_loop(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str, long: dict[str, Any], short: dict[str, Any]
) -> None:
    """A long input's tokenizing (megabytes of text take seconds) is held here until a short
    request has been answered: it must be off the event loop for that answer to come."""
    entered, release, left = threading.Event(), threading.Event(), threading.Event()
    encode_pair = Tokenizer.encode_pair

    def held(self: Tokenizer, text: str, pair: str | None = None, **kwargs: Any) -> Any:
        if len(text) + len(pair or "") <= INLINE_CHARS:
            return encode_pair(self, text, pair, **kwargs)
        entered.set()
        release.wait(5)
        try:
            return encode_pair(self, text, pair, **kwargs)
        finally:
            left.set()

    monkeypatch.setattr(Tokenizer, "encode_pair", held)
    big = asyncio.create_task(served.client.post(path, json=long))

    assert await asyncio.to_thread(entered.wait, 30)
    r = await served.client.post(path, json=short)
    assert r.status_code == 200, r.text
    assert not left.is_set()
    release.set()
    r = await big
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("served", [{"api_keys": ["k1"], "rate_limit_tpm": 20}], indirect=True)
async def test_keys_and_token_rate_limits_hold_as_for_generation(served: Served) -> None:
    body = {"model": "emb", "input": "hello world"}
    assert (await served.client.post("/v1/embeddings", json=body)).status_code == 401
    headers = {"Authorization": "Bearer k1"}
    assert (await served.client.post("/v1/embeddings", json=body, headers=headers)).status_code == 200
    big = {"model": "emb", "input": " ".join(["word"] * 30)}
    r = await served.client.post("/v1/embeddings", json=big, headers=headers)
    assert r.status_code == 429
    assert r.json()["error"]["type"]


async def test_models_and_metrics_include_the_encoders(served: Served) -> None:
    ids = {m["id"] for m in (await served.client.get("/v1/models")).json()["data"]}
    assert ids == {"tiny", "emb", "emb-text", "rr"}
    assert (await served.client.get("/v1/models/emb")).json()["id"] == "emb"
    await served.client.post("/v1/embeddings", json={"model": "emb", "input": "hello world"})
    metrics = (await served.client.get("/metrics")).text
    tokens = len(served.tokenizer.encode("hello world"))
    assert f'gateway_prompt_tokens_total{{model="emb"}} {tokens}.0' in metrics
    assert 'route="/v1/embeddings"' in metrics
