"""Tokenizing as generation does: a prompt as a completions request encodes it, chat messages as a
chat request renders and encodes them (gateway.core.prompt), so users see the ids the engine gets."""

from __future__ import annotations

from typing import Any

from gateway.apis.tokenize.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from gateway.core.generation import GenerationService
from gateway.core.models import ModelRuntime
from gateway.core.prompt import (
    Prompt,
    chat_prompt,
    check_images,
    raw_prompt,
    template_arguments,
    template_content,
    template_messages,
)
from gateway.errors import InvalidRequestError
from gateway.media import ImageRef


class TokenizeService(GenerationService):
    def _runtime(self, model: str | None) -> ModelRuntime:
        if model is not None:
            return self._registry.get(model)
        runtimes = list(self._registry)
        if len(runtimes) != 1:
            names = ", ".join(r.name for r in runtimes)
            raise InvalidRequestError(f"name the model: this server serves {names}", param="model")
        return runtimes[0]

    async def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        runtime = self._runtime(body.model)
        tokenizer = runtime.tokenizer
        if body.messages is not None:
            # The route decides what text the engine gets (a BOS the template writes is left to
            # the ensemble's preprocessing), so the engine's adapter must be known.
            await runtime.engine.ensure_ready()
            kwargs: dict[str, Any] = dict(body.chat_template_kwargs or {})
            if body.tools is not None:
                kwargs["tools"] = body.tools
            # Call ids handed back in the form the template takes, as a chat request renders them.
            refs: list[ImageRef] = []
            messages = template_messages(
                runtime, [_template_message(m, i, refs) for i, m in enumerate(body.messages)]
            )
            check_images(runtime, refs, "image_url")
            # Loaded as a chat request loads them: an image's token count may depend on its size.
            images = await self._media.load_images(refs)
            rendered = tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt, **kwargs
            )
            prompt = chat_prompt(runtime, rendered, images)
            if body.add_special_tokens is not None:
                prompt = Prompt(rendered, add_special_tokens=body.add_special_tokens, images=images)
        else:
            assert body.prompt is not None  # (the request's validator)
            prompt = raw_prompt(runtime, body.prompt)
            if body.add_special_tokens is not None:
                prompt = Prompt(body.prompt, add_special_tokens=body.add_special_tokens)
        text = prompt.text
        if prompt.images and runtime.expand_images is not None:
            # The ids the model reads: each image's placeholder expanded as its processor does.
            text = runtime.expand_images(text, prompt.images)
        ids = tokenizer.encode(text, add_special_tokens=prompt.add_special_tokens)
        return TokenizeResponse(
            count=len(ids),
            max_model_len=runtime.max_model_len,
            tokens=ids,
            token_strs=tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None,
        )

    async def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        runtime = self._runtime(body.model)
        bad = next((t for t in body.tokens if not 0 <= t < runtime.tokenizer.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} is outside the vocabulary", param="tokens")
        # As vLLM: the ids' text, special tokens included.
        return DetokenizeResponse(prompt=runtime.tokenizer.decode(body.tokens, skip_special_tokens=False))


def _template_message(message: dict[str, Any], position: int, images: list[ImageRef]) -> dict[str, Any]:
    """A chat message for the template: content parts of type text joined, image_url parts in
    place, as chat requests do."""
    if not isinstance(message.get("role"), str):
        raise InvalidRequestError("each message needs a role", param=f"messages[{position}].role")
    content = message.get("content")
    if isinstance(content, list):
        parts: list[str | ImageRef] = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            image = part.get("image_url") if isinstance(part, dict) else None
            if kind == "image_url" and isinstance(image, dict) and isinstance(image.get("url"), str):
                parts.append(ImageRef(image["url"], f"messages[{position}].content[{j}].image_url.url"))
                continue
            text = part.get("text") if kind == "text" else None
            if not isinstance(text, str):
                raise InvalidRequestError(
                    "only text and image_url content parts can be tokenized",
                    param=f"messages[{position}].content",
                )
            parts.append(text)
        content = template_content(parts, images)
    out = {**message, "content": content if content is not None else ""}
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        # As chat requests hand them: the arguments as an object, so the template renders
        # the prompt a chat request with these messages sends.
        out["tool_calls"] = [_template_call(call) for call in calls]
    return out


def _template_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    return {**call, "function": {**function, "arguments": template_arguments(function["arguments"])}}
