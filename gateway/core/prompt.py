"""What text the engine receives for a prompt, and how its ids are counted: the one place that
decides whether special tokens are added.

A rendered chat template is the prompt the model was trained on: encoded as transformers'
``apply_chat_template(tokenize=True)`` encodes it, with no special tokens added on top of what the
template writes (Llama 3, Gemma, DeepSeek and Llama 2 templates write their BOS themselves). A raw
completions prompt keeps the tokenizer's default, as the model's setting says.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.core.models import ModelRuntime
from gateway.engine import ImageInput
from gateway.errors import InvalidRequestError
from gateway.media import ImageRef
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls.choice import arguments_key
from gateway.text.tool_calls.registry import template_call_ids
from gateway.text.tool_turns import has_late_system, has_tool_turns, late_system_as_user, tool_turns_as_text


@dataclass(frozen=True, slots=True)
class Prompt:
    """The text sent to the engine and whether encoding it adds special tokens: together, the ids
    the engine sees (the gateway's count, the engine route's input)."""

    text: str
    add_special_tokens: bool
    # The images whose placeholders the chat template wrote into `text`, in order.
    images: tuple[ImageInput, ...] = ()
    # The conversation as one question, for a model that renders its chat template itself around
    # a question and its images (the llmapi model's `image_url`): see `image_question`.
    question: str | None = None


# A chat template's image part (the Hugging Face convention vision-language templates read:
# Gemma 3 writes `<start_of_image>` for it, Qwen2-VL `<|vision_start|><|image_pad|><|vision_end|>`).
IMAGE_PART: Final = {"type": "image"}


def template_content(
    parts: Sequence[str | ImageRef], images: list[ImageRef], *, joiner: str = ""
) -> str | list[dict[str, Any]]:
    """A message's content as its chat template takes it: without images, its texts joined as
    today; with images, text parts and image parts in the client's order (adjacent texts joined),
    each image appended to `images`, the request's images in prompt order."""
    if not any(isinstance(p, ImageRef) for p in parts):
        return joiner.join(p for p in parts if isinstance(p, str))
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
            continue
        if texts:
            out.append({"type": "text", "text": joiner.join(texts)})
            texts = []
        out.append(dict(IMAGE_PART))
        images.append(part)
    if texts:
        out.append({"type": "text", "text": joiner.join(texts)})
    return out


def check_images(runtime: ModelRuntime, images: Sequence[ImageRef], kind: str) -> None:
    """The 400 a model that takes no images gives (before anything is fetched), naming the first
    image's field and the API's name for the part (`kind`); also where the model's chat template
    would leave the images out of the prompt."""
    if not images:
        return
    if not runtime.engine.info.images:
        raise InvalidRequestError(
            f"content parts of type `{kind}` are not supported by this model (it takes text only)",
            param=images[0].param,
            code="images_not_supported",
        )
    if not runtime.tokenizer.renders_images:
        # The model would never see the images: refused rather than silently dropped.
        raise InvalidRequestError(
            "this model's chat template writes nothing for image parts, so the model would never see "
            "the images: serve it with a chat template that does (chat_template=FILE)",
            param=images[0].param,
            code="images_not_rendered",
        )


def raw_prompt(runtime: ModelRuntime, text: str) -> Prompt:
    """A completions prompt: special tokens as the model's setting says (the tokenizer's default)."""
    return Prompt(text, runtime.config.add_special_tokens)


def template_messages(runtime: ModelRuntime, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as the model's chat template takes it: call ids handed back in the form its
    tool format's template takes (Mistral's 9 characters; a client's `call_...` ids cut to fit),
    and, where the template has no tool turn or never reads an assistant's `tool_calls` (Gemma 3's,
    Llama 2's), the calls and results as text in the turns it has (text.tool_turns): every API's
    tool conversation served, never refused by the template or rendered without them; and where
    the template takes a system turn only first (Gemma 3's), a later one's text in the user turn
    beside it."""
    messages = template_call_ids(runtime.config.tool_parser, messages)
    tokenizer = runtime.tokenizer
    if has_tool_turns(messages):
        messages = tool_turns_as_text(
            messages,
            results_rendered=tokenizer.renders_tool_results,
            calls_rendered=tokenizer.renders_tool_calls,
            # The calls as the model wrote them: guided decoding's JSON in the model's format's keys.
            arguments_key=arguments_key(runtime.config.tool_parser),
        )
    if has_late_system(messages) and not tokenizer.renders_late_system:
        messages = late_system_as_user(messages)
    return messages


def image_question(messages: Sequence[dict[str, Any]] | None) -> str | None:
    """The conversation as a model that renders its template itself around one question and its
    images takes it: one user message whose images all come before its text (at most one text
    part), giving that text ("" without one). None for anything else (a system prompt, earlier
    turns, text before an image), which such a model cannot be sent as the client wrote it."""
    if not messages or len(messages) != 1 or messages[0].get("role") != "user":
        return None
    content = messages[0].get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    kinds = [part.get("type") if isinstance(part, dict) else None for part in content]
    texts = [part for part, kind in zip(content, kinds, strict=True) if kind == "text"]
    if any(kind not in ("image", "text") for kind in kinds) or len(texts) > 1:
        return None
    if "text" in kinds and "image" in kinds[kinds.index("text") :]:
        return None
    return str(texts[0].get("text", "")) if texts else ""


def chat_prompt(
    runtime: ModelRuntime,
    rendered: str,
    images: Sequence[ImageInput] = (),
    messages: Sequence[dict[str, Any]] | None = None,
) -> Prompt:
    """A rendered chat template: no special tokens on top of what the template writes.

    The engine route sends the gateway's ids, encoded without them. The ensemble route sends text,
    and its preprocessing adds the tokenizer's special tokens when the model's setting says it
    does (upstream's default): a template that writes them itself (its BOS) then leaves them out
    of the text sent, so the preprocessing's ids are the template's own. Where that cannot be
    done (the template writes no BOS the tokenizer adds) the ids are counted as the engine sees
    them, and `gateway check` and start-up say so (`template_specials_mismatch`)."""
    shown = tuple(images)
    question = image_question(messages) if shown else None
    if runtime.engine.info.route == "engine" or not runtime.config.add_special_tokens:
        return Prompt(rendered, add_special_tokens=False, images=shown, question=question)
    prefix, suffix = runtime.tokenizer.special_affixes
    if not prefix and not suffix:
        return Prompt(rendered, add_special_tokens=False, images=shown, question=question)
    if prefix and not suffix and rendered.startswith(prefix):
        return Prompt(rendered[len(prefix) :], add_special_tokens=True, images=shown, question=question)
    return Prompt(rendered, add_special_tokens=True, images=shown, question=question)


def template_specials_mismatch(runtime: ModelRuntime) -> str | None:
    """Why the ensemble's preprocessing cannot encode this model's chat template as transformers
    does, or None where it can (or the engine route is used)."""
    return specials_mismatch(runtime.engine.info.route, runtime.config.add_special_tokens, runtime.tokenizer)


def specials_mismatch(route: str, add_special_tokens: bool, tokenizer: Tokenizer) -> str | None:
    """`template_specials_mismatch` from a model's parts (`gateway check` has no runtime)."""
    if route == "engine" or not add_special_tokens:
        return None
    prefix, suffix = tokenizer.special_affixes
    if (not prefix and not suffix) or not tokenizer.has_chat_template:
        return None
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    except Exception:  # a template that needs more than one user turn says so on each request
        return None
    if not suffix and rendered.startswith(prefix):
        return None
    added = " and ".join(repr(t) for t in (prefix, suffix) if t)
    return (
        f"the ensemble's preprocessing adds {added} to every prompt and the chat template does not "
        "write it where the tokenizer puts it: chat prompts differ from the ones the model was "
        "trained on; serve it with route=engine, or set add_special_tokens false in the "
        "preprocessing model and add_special_tokens=false here"
    )


def template_arguments(raw: str) -> Any:
    """A tool call's arguments as a chat template gets them: the object their JSON text holds,
    as transformers and vLLM hand it (templates write `arguments | tojson` or index into them,
    so a string would be encoded twice); text that is no JSON object stays text."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, dict) else raw
