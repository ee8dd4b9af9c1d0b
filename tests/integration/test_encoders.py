"""Embeddings, rerank and score end to end: the tiny BERT encoder and cross-encoder on a CPU
tritonserver (ids in, as an ONNX or TensorRT export takes them; and text in), behind `gateway
serve`, checked with the real clients against the models run in transformers."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from deploy.devstack import TritonServer
from deploy.encoder_repo import render_encoder_repository
from deploy.tiny_encoder import build_tiny_encoder
from tests.support import http_client
from tests.support.docs_snippets import ROOT, RUNNABLE, SHELL, Block, all_blocks
from tests.support.gateway_process import GatewayProcess

pytestmark = pytest.mark.integration

TEXTS = ["The gateway serves embeddings.", "Triton runs the encoder model", "hello world"]
QUERY = "what serves the embeddings?"


class Stack:
    def __init__(self, base_url: str, embed_dir: Path, score_dir: Path) -> None:
        self.base_url = base_url
        self.embed_dir = embed_dir
        self.score_dir = score_dir


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("encoders")
    embed_dir = build_tiny_encoder("embed")
    score_dir = build_tiny_encoder("score")
    repo = root / "repo"
    render_encoder_repository(repo, embed_dir, task="embed", name="embedding", text_model="embedding_text")
    render_encoder_repository(repo, score_dir, task="score", name="reranker")
    with TritonServer([repo], work_dir=root / "triton") as triton:
        triton.wait_ready(180)
        args = [
            "--triton-url",
            triton.grpc_url,
            "--model",
            f"name=tiny-embed,triton_model=embedding,tokenizer={embed_dir}",
            "--model",
            f"name=tiny-embed-text,triton_model=embedding_text,tokenizer={embed_dir}",
            "--model",
            f"name=tiny-rerank,triton_model=reranker,tokenizer={score_dir}",
        ]
        # start() once (entering a GatewayProcess starts it again, with the default timeout).
        gateway = GatewayProcess(args)
        gateway.start(timeout=180)
        try:
            yield Stack(gateway.base_url, embed_dir, score_dir)
        finally:
            gateway.stop()


class Reference:
    """The tiny encoder's sentence embeddings computed in transformers as its sentence-transformers
    files define them (modules.json: Transformer, Pooling with mean tokens, Normalize)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModel, AutoTokenizer

        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
        modules = [m["type"] for m in json.loads((model_dir / "modules.json").read_text())]
        assert pooling["pooling_mode_mean_tokens"] and modules[-1].endswith("Normalize")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).eval()

    def encode(self, texts: list[str]) -> np.ndarray:
        import torch

        with torch.inference_mode():
            batch = self.tokenizer(texts, padding=True, return_tensors="pt")
            states = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
            mean = (states * mask).sum(1) / mask.sum(1)
            return torch.nn.functional.normalize(mean, dim=1).numpy()


@pytest.fixture(scope="module")
def reference(stack: Stack) -> Reference:
    return Reference(stack.embed_dir)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _assert_close(got: list[list[float]] | list[str], want: np.ndarray) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(g, str):
            # The SDK hands an asked-for base64 string back as it came: float32, little-endian.
            g = np.frombuffer(base64.b64decode(g), dtype="<f4").tolist()
        assert len(g) == len(w)
        assert _cosine(np.asarray(g), w) >= 0.9999
        assert np.allclose(g, w, atol=1e-4)


@pytest.mark.parametrize("model", ["tiny-embed", "tiny-embed-text"])
@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_sdk_embeddings_equal_the_reference_pooling(
    stack: Stack, reference: Reference, model: str, encoding_format: str
) -> None:
    import openai

    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x")
    want = reference.encode(TEXTS)
    many = client.embeddings.create(model=model, input=TEXTS, encoding_format=encoding_format)  # type: ignore[arg-type]
    _assert_close([d.embedding for d in many.data], want)
    one = client.embeddings.create(model=model, input=TEXTS[0], encoding_format=encoding_format)  # type: ignore[arg-type]
    _assert_close([one.data[0].embedding], want[:1])
    tokenizer = reference.tokenizer
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    by_ids = client.embeddings.create(model=model, input=ids, encoding_format=encoding_format)  # type: ignore[arg-type]
    _assert_close([d.embedding for d in by_ids.data], want)
    assert many.usage.prompt_tokens == sum(len(i) for i in ids) == by_ids.usage.prompt_tokens


def test_base64_is_little_endian_float32(stack: Stack, reference: Reference) -> None:
    body = {"model": "tiny-embed", "input": TEXTS[1], "encoding_format": "base64"}
    data = http_client.post(stack.base_url + "/v1/embeddings", json=body, timeout=60).json()["data"][0]
    vector = np.frombuffer(base64.b64decode(data["embedding"]), dtype="<f4")
    assert _cosine(vector, reference.encode([TEXTS[1]])[0]) >= 0.9999


def test_matryoshka_dimensions_are_truncated_and_renormalized(stack: Stack, reference: Reference) -> None:
    body = {"model": "tiny-embed", "input": TEXTS, "dimensions": 16}
    got = http_client.post(stack.base_url + "/v1/embeddings", json=body, timeout=60).json()["data"]
    full = reference.encode(TEXTS)
    want = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    _assert_close([d["embedding"] for d in got], want)
    refused = http_client.post(stack.base_url + "/v1/embeddings", json={**body, "dimensions": 12}, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "dimensions"


def test_langchain_and_llamaindex_get_the_reference_embeddings(stack: Stack, reference: Reference) -> None:
    from langchain_openai import OpenAIEmbeddings
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    want = reference.encode(TEXTS)
    langchain = OpenAIEmbeddings(
        model="tiny-embed", base_url=stack.base_url + "/v1", api_key="x", check_embedding_ctx_length=False
    )
    _assert_close(langchain.embed_documents(TEXTS), want)
    _assert_close([langchain.embed_query(TEXTS[0])], want[:1])
    llama = OpenAILikeEmbedding(model_name="tiny-embed", api_base=stack.base_url + "/v1", api_key="x")
    _assert_close(llama.get_text_embedding_batch(TEXTS), want)
    _assert_close([llama.get_query_embedding(TEXTS[2])], want[2:])


def test_rerank_and_score_equal_the_cross_encoders_logits(stack: Stack) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stack.score_dir)
    model = AutoModelForSequenceClassification.from_pretrained(stack.score_dir).eval()
    with torch.inference_mode():
        batch = tokenizer([QUERY] * len(TEXTS), TEXTS, padding=True, return_tensors="pt")
        logits = model(**batch).logits[:, 0].numpy().astype(np.float64)
    probs = 1 / (1 + np.exp(-logits))
    reranked = http_client.post(
        stack.base_url + "/v1/rerank",
        json={"model": "tiny-rerank", "query": QUERY, "documents": TEXTS, "top_n": 2},
        timeout=60,
    ).json()
    order = list(np.argsort(-probs)[:2])
    assert [r["index"] for r in reranked["results"]] == order
    assert np.allclose([r["relevance_score"] for r in reranked["results"]], probs[order], atol=1e-5)
    assert reranked["results"][0]["document"]["text"] == TEXTS[order[0]]
    scored = http_client.post(
        stack.base_url + "/v1/score",
        json={"model": "tiny-rerank", "text_1": QUERY, "text_2": TEXTS, "use_activation": False},
        timeout=60,
    ).json()
    assert np.allclose([d["score"] for d in scored["data"]], logits, atol=1e-5)
    assert scored["usage"]["prompt_tokens"] == int(batch["attention_mask"].sum())


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "tiny-embed", "input": []}),
        ("/v1/embeddings", {"model": "tiny-embed", "input": ""}),
        ("/v1/embeddings", {"model": "tiny-embed", "input": ["x"] * 100_000}),
        ("/v1/embeddings", {"model": "tiny-embed", "input": [[5, 10**9]]}),
        ("/v1/embeddings", {"model": "tiny-embed", "input": [1, "a"]}),
        ("/v1/embeddings", {"model": "tiny-embed", "input": " ".join(["word"] * 400)}),
        ("/v1/embeddings", {"model": "tiny-rerank", "input": "x"}),
        ("/v1/chat/completions", {"model": "tiny-embed", "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/rerank", {"model": "tiny-rerank", "query": "q", "documents": []}),
        ("/v1/rerank", {"model": "tiny-embed", "query": "q", "documents": ["d"]}),
        ("/v1/score", {"model": "tiny-rerank", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
    ],
)
def test_hostile_inputs_are_4xx_in_openais_shape(stack: Stack, path: str, body: dict[str, object]) -> None:
    response = http_client.post(stack.base_url + path, json=body, timeout=60)
    assert 400 <= response.status_code < 500, response.text
    assert isinstance(response.json()["error"]["message"], str)


def test_truncate_prompt_tokens_cuts_a_long_input(stack: Stack) -> None:
    body = {"model": "tiny-embed", "input": " ".join(["word"] * 400), "truncate_prompt_tokens": 16}
    response = http_client.post(stack.base_url + "/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 16


def test_models_lists_the_encoders(stack: Stack) -> None:
    ids = {m["id"] for m in http_client.get(stack.base_url + "/v1/models", timeout=10).json()["data"]}
    assert {"tiny-embed", "tiny-embed-text", "tiny-rerank"} <= ids


ENCODER_EXAMPLES = [b for b in all_blocks() if b.requires == "stack-encoders" and b.language in RUNNABLE]


@pytest.mark.parametrize("block", ENCODER_EXAMPLES, ids=lambda b: b.where)
def test_the_encoder_pages_examples_run(stack: Stack, block: Block, tmp_path: Path) -> None:
    code = block.text.replace("127.0.0.1:9000", stack.base_url.removeprefix("http://"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OPENAI_MAX_RETRIES": "0"}
    if block.language in SHELL:
        argv = ["bash", "-e", "-o", "pipefail", "-c", code.replace("curl -s ", "curl -sS --fail-with-body ")]
    else:
        argv = [sys.executable, "-c", code]
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"{block.where}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
