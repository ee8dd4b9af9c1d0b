"""The conversation as one question (what a model that renders its own template around a question
and its images can be sent), or None where it is not one."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.prompt import image_question

IMAGE = {"type": "image"}


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


@pytest.mark.parametrize(
    ("messages", "question"),
    [
        ([{"role": "user", "content": [IMAGE, _text("What?")]}], "What?"),
        ([{"role": "user", "content": [IMAGE, IMAGE, _text("Compare.")]}], "Compare."),
        ([{"role": "user", "content": [IMAGE]}], ""),
        # Text before an image, two text parts, a system prompt, earlier turns: not one question.
        ([{"role": "user", "content": [_text("Look:"), IMAGE]}], None),
        ([{"role": "user", "content": [IMAGE, _text("a"), _text("b")]}], None),
        (
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [IMAGE, _text("Hi")]}],
            None,
        ),
        (
            [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": [IMAGE, _text("And this?")]},
            ],
            None,
        ),
        ([{"role": "tool", "content": [IMAGE]}], None),
        (None, None),
    ],
)
def test_image_question(messages: list[dict[str, Any]] | None, question: str | None) -> None:
    assert image_question(messages) == question


def test_images_an_engine_cannot_carry_are_refused_before_anything_is_sent() -> None:
    from gateway.core.generation import check_image_request
    from gateway.core.prompt import Prompt
    from gateway.engine import EngineInfo, ImageInput
    from gateway.errors import InvalidRequestError

    image = ImageInput(b"x", "image/png", 1, 1, "data")
    one_image = EngineInfo("m", False, False, False, "current", images=True, images_per_request=1)
    check_image_request(one_image, Prompt("t", False, (image,)))
    with pytest.raises(InvalidRequestError, match="takes 1 image per request; the request has 2"):
        check_image_request(one_image, Prompt("t", False, (image, image)))
    question = EngineInfo("m", False, False, False, "llmapi", images=True, images_as_question=True)
    check_image_request(question, Prompt("t", False, (image,), question="What?"))
    with pytest.raises(InvalidRequestError, match="one question"):
        check_image_request(question, Prompt("t", False, (image,), question=None))
