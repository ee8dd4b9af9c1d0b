"""The gateway's harmony parser (openai-harmony's streaming parser fed the reply's decoded text
deltas, re-encoded) against the same library reading the whole reply's ids at once, on real
o200k-harmony token sequences.

openai-harmony loads its encoding from ``o200k_base.tiktoken``, which it downloads; the same file
is the gpt-oss ``tokenizer.json``'s vocabulary written in tiktoken's format, so it is built here
from the family's tokenizer and the library checks it against the sha256 it expects (a wrong byte
fails the load). Each reply is encoded by the gateway's tokenizer, the ids checked equal to the
library's encoding of the same text, and both read them, the gateway's path token by token and
in every two-way split: the thinking (analysis), the answer (final, and commentary to no one) and
the calls (commentary to functions.NAME) agree."""

from __future__ import annotations

import json
from typing import Any

import openai_harmony as harmony
import pytest

from gateway.text.harmony import tiktoken_ranks
from tests.unit.gateway.text.family_replies import calls, encode, family_dir, run_reply


@pytest.fixture(scope="module")
def encoding(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("tiktoken")
    data = json.loads((family_dir("gptoss") / "tokenizer.json").read_text(encoding="utf-8"))
    (folder / "o200k_base.tiktoken").write_bytes(tiktoken_ranks(data))
    with pytest.MonkeyPatch.context() as patch:
        # Read by the library when it loads the encoding, instead of downloading.
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


REPLIES = [
    "<|channel|>analysis<|message|>Need the weather in Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris", "days": 3}<|call|>',
    "<|channel|>analysis<|message|>Simple greeting, answer in kind.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Bonjour ! 😀 你好, ça va ?<|return|>",
    "<|channel|>analysis<|message|>Two lookups.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Looking both up.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
    '{"zone": "CET"}<|call|>',
    "<|channel|>final<|message|>No thinking needed: 42.<|return|>",
    "<|channel|>analysis<|message|>First thought.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Second thought.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done.<|return|>",
]


def reference(encoding: Any, ids: list[int]) -> tuple[str | None, str, list[tuple[str, Any]]]:
    """What openai-harmony reads in the reply: thinking, answer and calls."""
    parser = harmony.StreamableParser(encoding, role=harmony.Role.ASSISTANT)
    for token in ids:
        parser.process(token)
    thinking: list[str] = []
    answer: list[str] = []
    found: list[tuple[str, Any]] = []
    for message in parser.messages:
        text = "".join(part.text for part in message.content)
        recipient = message.recipient
        if recipient is not None and recipient.startswith("functions."):
            found.append((recipient.removeprefix("functions."), json.loads(text)))
        elif message.channel == "analysis" or recipient is not None:
            thinking.append(text)
        else:
            answer.append(text)
    return ("\n".join(thinking) or None), "\n".join(answer), found


@pytest.mark.parametrize("text", REPLIES)
def test_the_channel_parser_reads_a_reply_as_openai_harmony_does(encoding: Any, text: str) -> None:
    ids = encode("gptoss", text)
    # The family's tokenizer and harmony's own encoding give the same ids.
    assert ids == list(encoding.encode(text, allowed_special="all"))
    want = reference(encoding, ids)
    for splits in ((), range(1, len(ids)), *([cut] for cut in range(1, len(ids)))):
        got = run_reply("gptoss", ids, tool_parser="openai", splits=splits)
        assert (got.reply.reasoning, got.reply.content, calls(got.reply)) == want
