"""What to send: the request shape shared by every target, and the prompts (synthetic or a JSONL file).

JSONL dataset: one JSON object per line, blank lines ignored. Fields:
  prompt        string; the text sent to /v1/completions and to Triton's text_input
  messages      optional list of {"role", "content"}; sent as is to /v1/chat/completions
                (without it, chat sends [{"role": "user", "content": prompt}]; with only messages,
                completions and Triton get the contents joined by newlines)
  max_tokens    optional int; overrides --max-tokens for that request
  prompt_tokens optional int; informational, copied into the results
At least one of prompt and messages is required.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Endpoint = Literal["completions", "chat", "responses"]

# Short, common English words: most BPE and SentencePiece vocabularies hold each (with its leading
# space) as a single token, so N words approximate N tokens when no tokenizer is given.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are as with his they at be this have from or one "
    "had by but not what all were we when your can said there use an each which she do how their if "
    "will up other about out many then them these so some her would make like him into time has look "
    "two more go see no way could people my than first water been call who its now find long down day "
    "did get come made may part over new sound take only little work know place year live me back give "
    "most very after thing our just name good sentence man think say great where help through much "
    "before line right too mean old any same tell boy follow came want show also around form three small"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    messages: tuple[dict[str, str], ...] | None = None
    max_tokens: int | None = None
    prompt_tokens: int | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        if self.messages is not None:
            return [dict(m) for m in self.messages]
        return [{"role": "user", "content": self.text}]


@dataclass(frozen=True, slots=True)
class Workload:
    """The request parameters every target turns into its own wire format."""

    max_tokens: int = 128
    stream: bool = True
    ignore_eos: bool = False
    include_usage: bool = True
    temperature: float | None = None
    endpoint: Endpoint = "completions"
    extra_body: dict[str, Any] = field(default_factory=dict)

    def max_tokens_for(self, prompt: Prompt) -> int:
        return prompt.max_tokens if prompt.max_tokens is not None else self.max_tokens


def synthetic_prompts(
    count: int, prompt_tokens: int, *, seed: int = 0, tokenizer_dir: str | Path | None = None
) -> list[Prompt]:
    """`count` distinct prompts of about `prompt_tokens` tokens (exactly, with a tokenizer).

    Distinct prompts keep prefix caches from turning the benchmark into a cache benchmark.
    """
    if prompt_tokens < 1:
        raise ValueError("prompt_tokens must be >= 1")
    rng = random.Random(seed)
    if tokenizer_dir is None:
        prompts = []
        for _ in range(count):
            words = [rng.choice(_WORDS) for _ in range(prompt_tokens)]
            prompts.append(Prompt(text=" ".join(words)))
        return prompts
    tokenizer = _load_tokenizer(tokenizer_dir)
    return [
        Prompt(text=text, prompt_tokens=n)
        for text, n in (_exact_length_text(tokenizer, prompt_tokens, rng) for _ in range(count))
    ]


def _load_tokenizer(tokenizer_dir: str | Path) -> Any:
    # Imported lazily: transformers costs seconds of start-up and is only needed for exact lengths.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def _count(tokenizer: Any, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def _exact_length_text(tokenizer: Any, n: int, rng: random.Random) -> tuple[str, int]:
    """A text that encodes to exactly n tokens (without special tokens), if the vocabulary allows it.

    Decoding a token slice and re-encoding can merge or split at the edges, so trim or pad one word
    at a time until the count matches; give the closest text if it never does.
    """
    words = [rng.choice(_WORDS) for _ in range(n + 8)]
    ids = tokenizer.encode(" ".join(words), add_special_tokens=False)
    text = tokenizer.decode(ids[:n], skip_special_tokens=True)
    best = (abs(_count(tokenizer, text) - n), text)
    for _ in range(64):
        have = _count(tokenizer, text)
        if have == n:
            return text, n
        if have > n:
            text = text[: text.rstrip().rfind(" ")] if " " in text.strip() else text[:-1]
        else:
            text = f"{text} {rng.choice(_WORDS)}"
        best = min(best, (abs(_count(tokenizer, text) - n), text))
    return best[1], _count(tokenizer, best[1])


def load_dataset(path: str | Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from None
            prompts.append(_prompt_from_json(obj, f"{path}:{lineno}"))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def _prompt_from_json(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object")
    prompt = obj.get("prompt")
    messages = obj.get("messages")
    if prompt is None and messages is None:
        raise ValueError(f"{where}: needs 'prompt' or 'messages'")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{where}: 'prompt' must be a string")
    msgs: tuple[dict[str, str], ...] | None = None
    if messages is not None:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ValueError(f"{where}: 'messages' must be a list of {{role, content}} strings")
        msgs = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"{where}: 'max_tokens' must be a positive integer")
    prompt_tokens = obj.get("prompt_tokens")
    if prompt_tokens is not None and not isinstance(prompt_tokens, int):
        raise ValueError(f"{where}: 'prompt_tokens' must be an integer")
    text = prompt if prompt is not None else "\n".join(m["content"] for m in msgs or ())
    return Prompt(text=text, messages=msgs, max_tokens=max_tokens, prompt_tokens=prompt_tokens)


def cycle(prompts: Sequence[Prompt], i: int) -> Prompt:
    return prompts[i % len(prompts)]
