"""CPU stand-in of TensorRT-LLM's multimodal_encoders model: processed pixels -> prompt table.

The checkpoint's own vision tower and projector (transformers' ``get_image_features``) compute each
image's soft tokens in float32; the rows are the request's images' tokens in order, which the
preprocessing step's prompt-table ids (vocabulary size + k) point at.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import torch
        from transformers import AutoModelForImageTextToText

        config = json.loads(args["model_config"])
        model_dir = config.get("parameters", {}).get("model_dir", {}).get("string_value", "")
        if not model_dir or model_dir.startswith("${"):
            raise pb_utils.TritonModelException("parameter model_dir is required")
        torch.set_num_threads(1)
        self.torch = torch
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
        text = self.model.config.get_text_config()
        self.hidden_size = int(text.hidden_size)
        self.vocab_size = int(text.vocab_size)

    def _respond(self, request: Any) -> Any:
        pixels = pb_utils.get_input_tensor_by_name(request, "pixel_values").as_numpy()
        if pixels.ndim != 5 or pixels.shape[0] != 1:
            raise ValueError(f"pixel_values must be [1, images, channels, height, width]: {pixels.shape}")
        if pixels.shape[1] == 0:
            table = np.zeros((1, 0, self.hidden_size), dtype=np.float32)
        else:
            with self.torch.inference_mode():
                features = self.model.model.get_image_features(self.torch.from_numpy(pixels[0])).pooler_output
            table = features.reshape(1, -1, self.hidden_size).float().numpy()
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("OUT_PROMPT_EMBEDDING_TABLE", np.ascontiguousarray(table)),
                pb_utils.Tensor("OUT_PROMPT_VOCAB_SIZE", np.asarray([[table.shape[1]]], dtype=np.int32)),
            ]
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._respond(request))
            except Exception as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"multimodal_encoders: {exc}"))
                )
        return responses
