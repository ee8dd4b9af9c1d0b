"""Triton Python-backend preprocessing: prompt text -> token ids and engine inputs (stock tensor names).

Stop and bad words are tokenized one string at a time (as the stock model does) into the [2, -1] word
list format; END_ID/PAD_ID default to the tokenizer's eos/pad ids.

Where the config declares a PIXEL_VALUES output (the multimodal repository), a request's images
(IMAGE_URL data: URIs, or IMAGE_BYTES pixels with IMAGE_SIZES) and its prompt go through the model's
transformers processor, as TensorRT-LLM's multimodal preprocessing does: the processor expands each
image placeholder of the prompt into the image's tokens, which become prompt-table ids (vocabulary
size + k, k counting the request's image tokens), and its pixel values go on to the encoder.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import sys
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

_TRUE = ("true", "1", "yes", "on")


def _parameter(config: dict[str, Any], key: str, default: str) -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value and not value.startswith("${") else default


def _input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def word_list(rows: list[list[list[int]]]) -> np.ndarray:
    """[batch][words][ids] -> INT32 [batch, 2, N]: row 0 the concatenated ids (0-padded), row 1 the
    cumulative end offset of each word (-1-padded). N is at least 1, so "no words" is [[0], [-1]]."""
    width = max([1, *(sum(len(w) for w in words) for words in rows)])
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, words in enumerate(rows):
        flat = [t for w in words for t in w]
        out[b, 0, : len(flat)] = flat
        offsets = np.cumsum([len(w) for w in words], dtype=np.int64)
        out[b, 1, : len(offsets)] = offsets
    return out


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        tokenizer_dir = _parameter(config, "tokenizer_dir", "")
        if not tokenizer_dir:
            raise pb_utils.TritonModelException("parameter tokenizer_dir is required")
        self.add_special_tokens = _parameter(config, "add_special_tokens", "true").lower() in _TRUE
        images = any(o["name"] == "PIXEL_VALUES" for o in config.get("output", []))
        if not images and "torch" not in sys.modules:
            # Text needs the tokenizer alone, never torch; but where torch is installed, transformers
            # imports it with AutoTokenizer: seconds of CPU and hundreds of MB in this process.
            # Marked absent (find_spec then answers None), transformers takes the path it takes
            # without torch. The process is this model's alone. (A model's image processor may
            # want torch: with images, nothing changes.)
            sys.modules["torch"] = None  # type: ignore[assignment]
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        self.end_id = int(eos) if eos is not None else -1
        self.pad_id = int(pad) if pad is not None else self.end_id
        self.vocab_size = len(self.tokenizer)
        self.processor: Any = None
        if images:
            from transformers import AutoConfig, AutoProcessor

            self.processor = AutoProcessor.from_pretrained(tokenizer_dir)
            model_config = AutoConfig.from_pretrained(tokenizer_dir)
            self.image_token_id = int(model_config.image_token_id)
            # Prompt-table ids start after the language model's vocabulary (its embedding rows).
            self.table_base = int(model_config.get_text_config().vocab_size)
            size = self.processor.image_processor.size
            self.pixel_shape = (3, int(size["height"]), int(size["width"]))

    def _words(self, request: Any, name: str, batch: int) -> list[list[list[int]]]:
        value = _input(request, name)
        if value is None:
            return [[] for _ in range(batch)]
        value = value.reshape(value.shape[0], -1)
        rows = []
        for b in range(batch):
            strings = [_text(s) for s in value[b if value.shape[0] > b else 0].tolist()]
            ids = [self.tokenizer.encode(s, add_special_tokens=False) for s in strings if s]
            rows.append([w for w in ids if w])
        return rows

    def _embedding_bias(self, request: Any, batch: int) -> np.ndarray:
        words = _input(request, "EMBEDDING_BIAS_WORDS")
        weights = _input(request, "EMBEDDING_BIAS_WEIGHTS")
        if words is None and weights is None:
            return np.zeros((batch, 0), dtype=np.float32)
        if words is None or weights is None:
            raise ValueError("EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS go together")
        words, weights = words.reshape(words.shape[0], -1), weights.reshape(weights.shape[0], -1)
        bias = np.zeros((batch, self.vocab_size), dtype=np.float32)
        for b in range(batch):
            row_words = words[b if words.shape[0] > b else 0].tolist()
            row_weights = weights[b if weights.shape[0] > b else 0].tolist()
            if len(row_words) != len(row_weights):
                raise ValueError("EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS differ in length")
            for word, weight in zip(row_words, row_weights, strict=True):
                for token_id in self.tokenizer.encode(_text(word), add_special_tokens=False):
                    bias[b, token_id] += weight
        return bias

    def _ids(self, request: Any, name: str, default: int, batch: int) -> np.ndarray:
        value = _input(request, name)
        if value is None:
            return np.full((batch, 1), default, dtype=np.int32)
        return value.reshape(value.shape[0], -1)[:, :1].astype(np.int32)

    def _images(self, request: Any) -> list[Any]:
        """The request's images, in order: IMAGE_URL's data: URIs (this stand-in fetches nothing),
        else IMAGE_BYTES' pixel arrays cut to IMAGE_SIZES."""
        from PIL import Image

        urls = _input(request, "IMAGE_URL")
        pixels = _input(request, "IMAGE_BYTES")
        if urls is not None and pixels is not None:
            raise ValueError("IMAGE_URL and IMAGE_BYTES are exclusive")
        images = []
        if urls is not None:
            for url in urls.reshape(-1).tolist():
                text = _text(url)
                head, comma, payload = text.partition(",")
                if not (head.startswith("data:image/") and head.endswith(";base64") and comma):
                    raise ValueError("IMAGE_URL takes base64 data: URIs of images")
                try:
                    data = base64.b64decode(payload, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError("IMAGE_URL has a data: URI that is not valid base64") from None
                # The format is read from the bytes, as PIL does in TensorRT-LLM's preprocessing.
                images.append(Image.open(io.BytesIO(data)).convert("RGB"))
        elif pixels is not None:
            arrays = pixels.reshape(-1, *pixels.shape[-3:])
            sizes = _input(request, "IMAGE_SIZES")
            sizes = None if sizes is None else sizes.reshape(-1, 2)
            if sizes is not None and len(sizes) != len(arrays):
                raise ValueError(f"IMAGE_SIZES has {len(sizes)} rows for {len(arrays)} images")
            for i, array in enumerate(arrays):
                if sizes is not None:
                    array = array[: int(sizes[i][0]), : int(sizes[i][1])]
                images.append(Image.fromarray(np.ascontiguousarray(array), "RGB"))
        return images

    def _respond(self, request: Any) -> Any:
        query = _input(request, "QUERY")
        output_len = _input(request, "REQUEST_OUTPUT_LEN")
        batch = query.shape[0]
        texts = [_text(q) for q in query.reshape(batch, -1)[:, 0].tolist()]
        pixel_values = None
        if self.processor is not None:
            if batch != 1:
                raise ValueError("a multimodal request carries one prompt")
            images = self._images(request)
            encoded = self.processor(
                text=texts[0],
                images=images or None,
                add_special_tokens=self.add_special_tokens,
                return_tensors="np",
            )
            ids = [int(t) for t in encoded["input_ids"][0]]
            next_row = iter(range(self.table_base, self.table_base + len(ids)))
            prompts = [[next(next_row) if t == self.image_token_id else t for t in ids]]
            pixel_values = (
                np.asarray(encoded["pixel_values"], dtype=np.float32)[None]
                if images
                else np.zeros((1, 0, *self.pixel_shape), dtype=np.float32)
            )
        else:
            prompts = [self.tokenizer.encode(t, add_special_tokens=self.add_special_tokens) for t in texts]
        if any(not p for p in prompts):
            raise ValueError("the prompt tokenizes to no tokens")
        pad_ids = self._ids(request, "PAD_ID", self.pad_id, batch)
        width = max(len(p) for p in prompts)
        input_ids = np.empty((batch, width), dtype=np.int32)
        for b, prompt in enumerate(prompts):
            input_ids[b, :] = pad_ids[b if pad_ids.shape[0] > b else 0, 0]
            input_ids[b, : len(prompt)] = prompt
        tensors = {
            "INPUT_ID": input_ids,
            "REQUEST_INPUT_LEN": np.asarray([[len(p)] for p in prompts], dtype=np.int32),
            "BAD_WORDS_IDS": word_list(self._words(request, "BAD_WORDS_DICT", batch)),
            "STOP_WORDS_IDS": word_list(self._words(request, "STOP_WORDS_DICT", batch)),
            "EMBEDDING_BIAS": self._embedding_bias(request, batch),
            "REQUEST_OUTPUT_LEN": output_len.reshape(batch, -1).astype(np.int32),
            "OUT_END_ID": self._ids(request, "END_ID", self.end_id, batch),
            "OUT_PAD_ID": pad_ids,
        }
        if pixel_values is not None:
            tensors["PIXEL_VALUES"] = pixel_values
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, v) for n, v in tensors.items()])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._respond(request))
            except Exception as exc:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}"))
                )
        return responses
