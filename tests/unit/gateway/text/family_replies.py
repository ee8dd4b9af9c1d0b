"""Replies of the real model families as their tokenizers encode them, run through the gateway's own
streaming path (end ids, the incremental decode with special tokens kept or not, the reasoning
parser, the tool-call parser), token by token or in any other split."""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

from deploy.families import build_family_model
from deploy.publish import publish_dir
from gateway.core.choices import ChoiceState
from gateway.core.generation import reasoning_format
from gateway.engine import GenerationDelta
from gateway.text.detokenizer import ids_decoder
from gateway.text.harmony import load_encoding
from gateway.text.reply import ParsedReply, ReplyCollector, ReplyEvent, ReplyParser
from gateway.text.tokenizer import Tokenizer
from gateway.text.tool_calls import ForcedToolParser, StreamingToolParser, ToolCallArguments
from gateway.text.tool_calls.json_text import INVALID, JsonScanner
from gateway.text.tool_calls.registry import needs_special_tokens
from tests.support.tokenizers import loaded_tokenizer

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
CLOCK = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Clock", "parameters": CLOCK}},
]
PARAMETERS: Mapping[str, Any] = {"get_weather": WEATHER, "get_time": CLOCK}


# DeepSeek-R1 is DeepSeek V3's vocabulary with two placeholders named as its think markers (ordinary
# added tokens, kept by a default decode), and V3's template with the generation prompt opening the
# think block, as R1's own template does since its 2025 revision.
R1_TOKENS: Final = {128798: "<think>", 128799: "</think>"}
R1_PROMPT: Final = ("{{'<｜Assistant｜>'}}{% endif %}", "{{'<｜Assistant｜><think>\\n'}}{% endif %}")


@functools.cache
def family_dir(family: str) -> Path:
    """The family's model directory as a user serves it (its tokenizer, template, end ids)."""
    if family == "deepseek_r1":
        return _r1_dir()
    return build_family_model(family)


def _r1_dir() -> Path:
    source = build_family_model("deepseek_v3")
    out = source.with_name(source.name + "-r1")

    def build(staging: Path) -> None:
        for item in source.iterdir():
            if item.name not in ("tokenizer.json", "tokenizer_config.json"):
                (staging / item.name).symlink_to(item)
        data = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
        for added in data["added_tokens"]:
            if added["id"] in R1_TOKENS:
                added.update(content=R1_TOKENS[added["id"]], special=False)
        (staging / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
        for key, added in config.get("added_tokens_decoder", {}).items():
            if int(key) in R1_TOKENS:
                added.update(content=R1_TOKENS[int(key)], special=False)
        template = config["chat_template"]
        assert template.count(R1_PROMPT[0]) == 1
        config["chat_template"] = template.replace(*R1_PROMPT)
        text = json.dumps(config, ensure_ascii=False)
        (staging / "tokenizer_config.json").write_text(text, encoding="utf-8")

    publish_dir(out, build, marker="tokenizer_config.json")
    return out


@functools.cache
def family_tokenizer(family: str) -> Tokenizer:
    return loaded_tokenizer(family_dir(family))


@functools.cache
def harmony_encoding() -> Any:
    """openai-harmony's encoding, built from the gpt-oss family's tokenizer.json as a served gpt-oss
    model's is (cached beside the family models)."""
    return load_encoding(family_dir("gptoss"), family_dir("gptoss").parent / "harmony-cache")


def reply_encoding(fmt: Any) -> Any:
    """What a served model of the format gets from `ReasoningFormat.load` (harmony's encoding)."""
    return harmony_encoding() if fmt is not None and fmt.load is not None else None


def encode(family: str, text: str) -> list[int]:
    return family_tokenizer(family).encode(text, add_special_tokens=False)


def served(family: str, tool_parser: str, reasoning_parser: str) -> Any:
    """What `reasoning_format` reads of a served model: its parsers, and an engine that gives ids."""
    return SimpleNamespace(
        name=family,
        config=SimpleNamespace(reasoning_parser=reasoning_parser, tool_parser=tool_parser),
        engine=SimpleNamespace(info=SimpleNamespace(exposes_token_ids=True, route="engine")),
    )


def run_text(
    text: str, *, tool_parser: str, reasoning_parser: str = "none", prompt: str = "", step: int | None = None
) -> ParsedReply:
    """The decoded reply `text` through the parsers alone, fed `step` characters at a time."""
    fmt = reasoning_format(served("", tool_parser, reasoning_parser))
    reasoning = fmt.parser(prompt=prompt, encoding=reply_encoding(fmt)) if fmt is not None else None
    tools = StreamingToolParser(tool_parser, tool_names=PARAMETERS, tool_parameters=PARAMETERS)
    parser = ReplyParser(reasoning=reasoning, tools=tools)
    collector = ReplyCollector()
    size = step or max(len(text), 1)
    for i in range(0, len(text), size):
        collector.add(parser.feed(text[i : i + size]))
    collector.add(parser.finish())
    return collector.reply()


@dataclass(frozen=True, slots=True)
class Streamed:
    reply: ParsedReply
    finish_reason: str
    # Each call's argument fragments in the order they were streamed.
    fragments: dict[int, list[str]]
    events: list[ReplyEvent]


def run_reply(
    family: str,
    ids: Sequence[int],
    *,
    tool_parser: str,
    reasoning_parser: str = "none",
    prompt: str = "",
    splits: Sequence[int] = (),
    max_tokens: int = 4096,
    forced: bool = False,
    forced_name: str | None = None,
) -> Streamed:
    """The reply `ids` fed in pieces cut at `splits` (token positions), as a served model of the
    family with those parsers streams it."""
    tok = family_tokenizer(family)
    fmt = reasoning_format(served(family, tool_parser, reasoning_parser))
    keep = (fmt is not None and fmt.keeps_special_tokens) or needs_special_tokens(
        tool_parser, tok.skipped_tokens
    )
    end_ids = frozenset([tok.info.eos_token_id, *tok.info.extra_end_ids]) - {None}
    choice = ChoiceState(
        0,
        ids_decoder(tok, skip_special_tokens=not keep),
        stops=(),
        end_ids=frozenset(i for i in end_ids if i is not None),
        max_tokens=max_tokens,
        keep_ids=fmt is not None,
    )
    reasoning = None
    if fmt is not None and not forced:
        reasoning = fmt.parser(
            prompt=prompt, marker_ids=fmt.marker_ids(tok.vocab), encoding=reply_encoding(fmt)
        )
    tools: StreamingToolParser | ForcedToolParser
    if forced:
        tools = ForcedToolParser(name=forced_name, tool_names=PARAMETERS)
    else:
        tools = StreamingToolParser(tool_parser, tool_names=PARAMETERS, tool_parameters=PARAMETERS)
    parser = ReplyParser(reasoning=reasoning, tools=tools)
    collector = ReplyCollector()
    events: list[ReplyEvent] = []
    bounds = [0, *sorted(set(splits)), len(ids)]
    for start, stop in itertools.pairwise(bounds):
        if start == stop:
            continue
        text = choice.feed(GenerationDelta(0, token_ids=tuple(ids[start:stop])))
        new = parser.feed(text, choice.take_ids())
        events += new
        if choice.done:
            break
    if not choice.done:
        text = choice.finish()
        events += parser.feed(text, choice.take_ids())
    events += parser.finish()
    collector.add(events)
    fragments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ToolCallArguments):
            fragments.setdefault(event.index, []).append(event.arguments)
    assert choice.finish_reason is not None
    return Streamed(collector.reply(), choice.finish_reason, fragments, events)


def assert_json_prefixes(fragments: Mapping[int, Sequence[str]]) -> None:
    """Every streamed prefix of every call's arguments can still become valid JSON."""
    for pieces in fragments.values():
        scanner = JsonScanner(object_only=True)
        for piece in pieces:
            scanner.feed(piece)
            assert scanner.state != INVALID, pieces


def calls(reply: ParsedReply) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]
