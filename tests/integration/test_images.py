"""Images through `gateway dev --model-dir <tiny Gemma 3 VLM>` on both engines, against
transformers' own processor and greedy `generate` for the same images and prompt.

The C++ engine serves TensorRT-LLM's multimodal ensemble (the gateway renders the chat template
with its image placeholders; preprocessing, encoder and engine compute the rest); the llmapi engine
the `image_url` model (it renders the template itself around the question, each image's
placeholder first, joined by newlines: the reference renders that same conversation).
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support import http_client
from tests.support.gateway_process import free_port
from tests.support.images import data_uri_of as data_uri
from tests.support.images import image_bytes

pytestmark = pytest.mark.integration

STARTUP_TIMEOUT_S = 600.0
MAX_TOKENS = 8
PNG = image_bytes("png", (40, 28), 1)
JPEG = image_bytes("jpeg", (30, 50), 2)
OTHER_PNG = image_bytes("png", (24, 24), 3)
IMAGE = {"type": "image"}


@dataclass(frozen=True)
class Stack:
    engine: str
    url: str

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vlm_dir() -> Path:
    from deploy.tiny_vlm import build_vlm_model

    return build_vlm_model("gemma3")


@pytest.fixture(scope="module", params=["cpp", "llmapi"])
def stack(request: pytest.FixtureRequest, vlm_dir: Path) -> Iterator[Stack]:
    """`gateway dev --model-dir` as a user starts it, once per engine."""
    port = free_port()
    gateway = Path(sys.executable).with_name("gateway")
    proc = subprocess.Popen(
        [str(gateway), "dev", "--model-dir", str(vlm_dir), "--engine", request.param, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in out], daemon=True).start()
    try:
        seen: list[str] = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not (seen and seen[-1].startswith("Ready: ")):
            try:
                seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.1)))
            except queue.Empty:
                pytest.fail("gateway dev did not become ready:\n" + "".join(seen[-40:]))
            assert proc.poll() is None or not lines.empty(), "".join(seen[-40:])
        yield Stack(request.param, f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def reference(vlm_dir: Path) -> Callable[[list[dict[str, Any]], list[bytes]], tuple[str, int]]:
    """transformers' greedy answer and prompt token count for chat messages whose image parts take
    the images in order: its processor (chat template, image placeholders expanded) and `generate`."""
    import io

    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(vlm_dir))
    model = AutoModelForImageTextToText.from_pretrained(str(vlm_dir)).eval()

    def answer(
        messages: list[dict[str, Any]], images: list[bytes], tokens: int = MAX_TOKENS
    ) -> tuple[str, int]:
        pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(
            text=prompt, images=pictures or None, return_tensors="pt", add_special_tokens=False
        )
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
        length = int(inputs["input_ids"].shape[1])
        return processor.decode(out[0][length:], skip_special_tokens=True), length

    return answer


def _expected(
    stack: Stack, parts: list[dict[str, Any]], images: list[bytes], reference: Any, tokens: int = MAX_TOKENS
) -> tuple[str, int]:
    """The reference for one user message of `parts` ({"type": "image"} / text parts) as the
    engine's contract renders it: the C++ path renders the conversation as sent; the llmapi model
    renders one user message of the images' placeholders then the question, newline-joined."""
    if stack.engine == "cpp":
        return reference([{"role": "user", "content": parts}], images, tokens)
    question = "".join(p["text"] for p in parts if p["type"] == "text")
    content = "\n".join(["<start_of_image>"] * len(images) + [question])
    return reference([{"role": "user", "content": content}], images, tokens)


def _openai_parts(parts: list[dict[str, Any]], images: list[bytes]) -> list[dict[str, Any]]:
    pictures = iter(images)
    return [
        {"type": "image_url", "image_url": {"url": data_uri(next(pictures))}} if p["type"] == "image" else p
        for p in parts
    ]


def test_models_list_says_it_takes_images(stack: Stack) -> None:
    models = http_client.get(f"{stack.url}/v1/models", timeout=30).json()["data"]
    assert models[0]["input_modalities"] == ["text", "image"]


def test_one_png_whole_and_two_images_streamed_equal_transformers(stack: Stack, reference: Any) -> None:
    client = stack.openai()
    one = [IMAGE, {"type": "text", "text": "What is in this picture?"}]
    want, prompt_tokens = _expected(stack, one, [PNG], reference)
    got = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": _openai_parts(one, [PNG])}],  # type: ignore[misc]
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert got.choices[0].message.content == want
    assert got.usage is not None
    if stack.engine == "cpp":
        # The ensemble reports no prompt tokens: the gateway's count equals the processor's.
        assert got.usage.prompt_tokens == prompt_tokens

    # Two images, a PNG and a JPEG; on the C++ path with text between them, as the client wrote it.
    if stack.engine == "cpp":
        two = [IMAGE, {"type": "text", "text": "Compare"}, IMAGE, {"type": "text", "text": "with the first."}]
    else:
        two = [IMAGE, IMAGE, {"type": "text", "text": "Compare them."}]
    want, prompt_tokens = _expected(stack, two, [PNG, JPEG], reference)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": _openai_parts(two, [PNG, JPEG])}],  # type: ignore[misc]
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    usage = chunks[-1].usage
    assert usage is not None
    if stack.engine == "cpp":
        assert usage.prompt_tokens == prompt_tokens


def test_anthropic_base64_image_block(stack: Stack, reference: Any) -> None:
    parts = [IMAGE, {"type": "text", "text": "Describe it."}]
    want, _ = _expected(stack, parts, [JPEG], reference)
    got = stack.anthropic().messages.create(
        model="tiny",
        max_tokens=MAX_TOKENS,
        # Greedy (the SDK has no temperature argument; the API takes it).
        extra_body={"temperature": 0},
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {
                            "type": "base64",
                            "media_type": "image/jpeg",
                            "data": data_uri(JPEG).split(",", 1)[1],
                        },
                    },
                    {"type": "text", "text": "Describe it."},
                ],
            }
        ],
    )
    assert got.content[0].type == "text"
    assert got.content[0].text == want


def test_anthropic_image_in_a_tool_result(stack: Stack, reference: Any) -> None:
    """An image a tool returned (as Claude Code's Read tool returns a PNG) reaches the model: the
    answer is transformers' for that image. Gemma 3's template has no tool turn, so the gateway
    shows the call as the JSON the model writes for it and the result as a user turn in a
    ```tool_output``` block, the image in place. The llmapi model cannot be sent a conversation with
    earlier turns: a 400 saying so, never a dropped image."""
    client = stack.anthropic()

    def ask(image: bytes) -> Any:
        return client.messages.create(
            model="tiny",
            max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},
            messages=[
                {"role": "user", "content": "Read the screenshot."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.png"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [
                                {
                                    "type": "image",
                                    "source": {
                                        "type": "base64",
                                        "media_type": "image/png",
                                        "data": data_uri(image).split(",", 1)[1],
                                    },
                                }
                            ],
                        }
                    ],
                },
            ],
        )

    if stack.engine == "llmapi":
        # The model renders its template itself around one question and its images.
        with pytest.raises(anthropic.BadRequestError) as caught:
            ask(PNG)
        assert "one question" in caught.value.message
        return
    shown = [
        {"role": "user", "content": [{"type": "text", "text": "Read the screenshot."}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": '{"name": "Read", "arguments": {"path": "a.png"}}'}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "```tool_output\n"},
                IMAGE,
                {"type": "text", "text": "\n```"},
            ],
        },
    ]
    want = [reference(shown, [image])[0] for image in (PNG, OTHER_PNG)]
    assert want[0] != want[1]  # (the images give the tiny model different answers)
    for image, expected in zip((PNG, OTHER_PNG), want, strict=True):
        got = ask(image)
        assert [b.text for b in got.content if b.type == "text"] == [expected]


def test_responses_input_image(stack: Stack, reference: Any) -> None:
    parts = [IMAGE, {"type": "text", "text": "What color dominates?"}]
    # OpenAI's least max_output_tokens.
    want, _ = _expected(stack, parts, [PNG], reference, 16)
    got = stack.openai().responses.create(
        model="tiny",
        max_output_tokens=16,
        temperature=0,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_uri(PNG), "detail": "auto"},
                    {"type": "input_text", "text": "What color dominates?"},
                ],
            }
        ],
    )
    assert got.output_text == want


def test_llmapi_refuses_what_its_template_rendering_cannot_carry(stack: Stack) -> None:
    if stack.engine != "llmapi":
        pytest.skip("the C++ path renders any conversation itself")
    with pytest.raises(openai.BadRequestError) as caught:
        stack.openai().chat.completions.create(
            model="tiny",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": _openai_parts([IMAGE, {"type": "text", "text": "Hi"}], [PNG])},  # type: ignore[misc]
            ],
            max_tokens=MAX_TOKENS,
        )
    assert caught.value.status_code == 400
    assert "one question" in str(caught.value)
