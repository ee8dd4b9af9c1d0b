"""Triton Python-backend postprocessing: engine token ids -> OUTPUT bytes (stock tensor names).

With the parameter ``text_output`` = ``token_bytes`` (our default), OUTPUT is the exact surface bytes
of the tokens (see token_bytes.py), not each response decoded on
its own: joining a stream's OUTPUT bytes gives exactly the text even when a token is half a UTF-8
character or starts a SentencePiece word. A whole sequence gives the same bytes at once, so the only
difference from ``tokenizer.decode`` is that a SentencePiece text keeps its first word's leading space
(as the continuation of a prompt does) and no clean-up of tokenization spaces is applied.

Without it (``stock_postprocessing``), OUTPUT is what upstream's postprocessing gives: the tokens of
each response decoded on their own with ``tokenizer.decode(..., skip_special_tokens)``, exact for a
whole (non-streamed) result, lossy for a streamed one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# This model needs the tokenizer alone, never torch; but where torch is installed, transformers
# imports it with AutoTokenizer: seconds of CPU and hundreds of MB in this process. Marked absent
# (find_spec then answers None), transformers takes the path it takes without torch. This Python
# model has its process to itself.
if "torch" not in sys.modules:
    sys.modules["torch"] = None  # type: ignore[assignment]
from token_bytes import TokenBytes
from transformers import AutoTokenizer

_TRUE = ("true", "1", "yes", "on")


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value and not value.startswith("${") else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        tokenizer_dir = _parameter(config, "tokenizer_dir", "")
        if not tokenizer_dir:
            raise pb_utils.TritonModelException("parameter tokenizer_dir is required")
        skip_special_tokens = _parameter(config, "skip_special_tokens", "true").lower() in _TRUE
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.skip_special_tokens = skip_special_tokens
        self.token_bytes: TokenBytes | None = None
        if _parameter(config, "text_output", "") == "token_bytes":
            self.token_bytes = TokenBytes(self.tokenizer, skip_special_tokens=skip_special_tokens)

    def _text(self, ids: list[int]) -> bytes:
        if self.token_bytes is not None:
            return self.token_bytes.join(ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)).encode()

    def _respond(self, request: Any) -> Any:
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        if tokens.ndim == 2:
            tokens = tokens[:, None, :]
        lengths = lengths.reshape(tokens.shape[0], -1)
        out = np.empty(tokens.shape[:2], dtype=object)
        for b in range(tokens.shape[0]):
            for beam in range(tokens.shape[1]):
                out[b, beam] = self._text([int(t) for t in tokens[b, beam, : int(lengths[b, beam])]])
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out)])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._respond(request))
            except Exception as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}"))
                )
        return responses
