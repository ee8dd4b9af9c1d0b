"""Triton Python-backend stand-in of an exported encoder (CPU, torch): the same inputs and outputs as
an ONNX or TensorRT export of a sentence-transformers or optimum model, so the gateway drives it as
it drives those.

Parameter `role`: ``hidden_states`` (input_ids, attention_mask, token_type_ids -> last_hidden_state
[batch, tokens, hidden], as optimum's feature-extraction export), ``classifier`` (the same inputs ->
logits [batch, labels], a sequence-classification export), ``text_embedding`` (text_input BYTES ->
embedding [batch, dim]: tokenizing, mean pooling and normalizing in the model, as a Python model
serving a sentence-transformers model does). Parameter `model_dir`: the Hugging Face directory.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer


def _parameter(config: dict[str, Any], key: str) -> str:
    return str(config.get("parameters", {}).get(key, {}).get("string_value", ""))


def _input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.role = _parameter(config, "role")
        model_dir = _parameter(config, "model_dir")
        torch.set_num_threads(1)
        if self.role == "classifier":
            self.model = AutoModelForSequenceClassification.from_pretrained(model_dir)
        else:
            self.model = AutoModel.from_pretrained(model_dir)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir) if self.role == "text_embedding" else None

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._one(request) for request in requests]

    def _one(self, request: Any) -> Any:
        with torch.inference_mode():
            if self.role == "text_embedding":
                raw = _input(request, "text_input")
                texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in raw.reshape(-1)]
                batch = self.tokenizer(texts, padding=True, return_tensors="pt")
                states = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
                pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out = torch.nn.functional.normalize(pooled, p=2, dim=1)
                return pb_utils.InferenceResponse([pb_utils.Tensor("embedding", out.numpy().astype(np.float32))])
            ids = torch.from_numpy(_input(request, "input_ids").astype(np.int64))
            mask = torch.from_numpy(_input(request, "attention_mask").astype(np.int64))
            types = _input(request, "token_type_ids")
            kwargs = {"input_ids": ids, "attention_mask": mask}
            if types is not None:
                kwargs["token_type_ids"] = torch.from_numpy(types.astype(np.int64))
            if ids.shape[1] > self.model.config.max_position_embeddings:
                raise pb_utils.TritonModelException("input longer than the model's positions")
            if int(ids.max()) >= self.model.config.vocab_size or int(ids.min()) < 0:
                raise pb_utils.TritonModelException("token id outside the vocabulary")
            if self.role == "classifier":
                logits = self.model(**kwargs).logits
                return pb_utils.InferenceResponse([pb_utils.Tensor("logits", logits.numpy().astype(np.float32))])
            states = self.model(**kwargs).last_hidden_state
            return pb_utils.InferenceResponse(
                [pb_utils.Tensor("last_hidden_state", states.numpy().astype(np.float32))]
            )
