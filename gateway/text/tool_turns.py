"""Tool calls and tool results for a chat template that has no place for them.

Many chat templates know only user and assistant turns: Gemma 3's and Llama 2's refuse any other
role ("Conversation roles must alternate"), others leave a `tool` turn out, and a template that never
reads an assistant turn's `tool_calls` drops them without a word. On such a model a tool call can
still happen (a forced choice, made a valid call by guided decoding), and the client then sends the
call and its result back. Rather than refuse the conversation or render it without them, the model
is shown both as text in the turns it knows:

- the assistant's calls as the JSON it wrote for them (guided decoding on a template with no tools
  writes `{"name": ..., "arguments": {...}}`, an array of them for several calls), after the
  turn's text, so the model reads its own earlier output;
- each tool result as a user turn, its text and images in order inside a ```` ```tool_output ````
  block, the form Google's Gemma function-calling guides hand a tool's result back to the model
  in; consecutive results and the user turn after them are one user turn, so templates that insist
  on alternating roles take the conversation.

Templates that render tool turns and calls get the conversation unchanged (`Tokenizer` probes
which of the two a template renders).

System turns after the first are the same kind of turn for many templates: clients put them
mid-conversation (Claude Code sends its environment as a `system` message after the user's), and
Gemma 3's template takes a system prompt only as the first message, refusing one anywhere else.
There a later system turn's text is given to the model in the user turn it stands beside, as Gemma
3's own template gives the model its first system prompt inside the first user turn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

# Google's Gemma function-calling guides: "Gemma is expecting to get its result back wrapped with
# ```tool_output```".
RESULT_OPEN: Final = "```tool_output\n"
RESULT_CLOSE: Final = "\n```"
# Between texts joined into one turn: a paragraph, as merged turns are joined elsewhere.
TURN_JOINER: Final = "\n\n"

Content = str | list[dict[str, Any]]


def has_tool_turns(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether the conversation holds a tool result or an assistant turn's calls."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def tool_turns_as_text(
    messages: list[dict[str, Any]],
    *,
    results_rendered: bool,
    calls_rendered: bool,
    arguments_key: str = "arguments",
) -> list[dict[str, Any]]:
    """`messages` as a template that renders tool results (`results_rendered`) and assistant
    calls (`calls_rendered`) as told shows them all: what it would leave out or refuse, written as
    text into user and assistant turns. The list itself where nothing needs it (no message is
    changed in place). `arguments_key`: the key the model's own calls give their arguments under
    (Llama 3's JSON calls write `parameters`)."""
    if (results_rendered and calls_rendered) or not has_tool_turns(messages):
        return messages
    out: list[dict[str, Any]] = []
    # Indexes in `out` of user turns made from tool results: the turns merged with their neighbours.
    results: set[int] = set()
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls") and not calls_rendered:
            turn = {k: v for k, v in message.items() if k != "tool_calls"}
            turn["content"] = _joined(
                message.get("content") or "", _calls_text(message["tool_calls"], arguments_key)
            )
            out.append(turn)
        elif role == "tool" and not results_rendered:
            _fold_as_user(out, _result(message.get("content")), results)
        elif not _joined_to_folded(out, message, results):
            out.append(message)
    return out


def has_late_system(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a system turn comes after the conversation's first message."""
    return any(m.get("role") == "system" for m in messages[1:])


def late_system_as_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with every system turn but a leading one folded into the user turn beside it:
    joined to the user turn before it, and the user turn after it joined on, so that templates that
    insist on alternating roles take the conversation; a user turn of its own where no user turn
    is beside it. The list itself where there is none (no message is changed in place)."""
    if not has_late_system(messages):
        return messages
    out: list[dict[str, Any]] = [messages[0]]
    # Indexes in `out` of user turns holding a folded system turn: the turns merged with the next.
    folded: set[int] = set()
    for message in messages[1:]:
        if message.get("role") == "system":
            _fold_as_user(out, message.get("content") or "", folded)
        elif not _joined_to_folded(out, message, folded):
            out.append(message)
    return out


def _fold_as_user(out: list[dict[str, Any]], content: Content, folded: set[int]) -> None:
    """`content` as user text: joined to the user turn before it, else a user turn of its own;
    marked in `folded` so that the user turn after it joins too."""
    if out and out[-1].get("role") == "user":
        out[-1] = {**out[-1], "content": _joined(out[-1].get("content") or "", content)}
    else:
        out.append({"role": "user", "content": content})
    folded.add(len(out) - 1)


def _joined_to_folded(out: list[dict[str, Any]], message: dict[str, Any], folded: set[int]) -> bool:
    """Joins a user turn that follows a folded one onto it (a new turn would break alternation)."""
    if message.get("role") != "user" or not out or len(out) - 1 not in folded:
        return False
    out[-1] = {**message, "content": _joined(out[-1].get("content") or "", message.get("content") or "")}
    return True


def _calls_text(calls: Sequence[dict[str, Any]], arguments_key: str) -> str:
    written = [
        {
            "name": call.get("function", {}).get("name"),
            arguments_key: call.get("function", {}).get("arguments"),
        }
        for call in calls
    ]
    return json.dumps(written[0] if len(written) == 1 else written, ensure_ascii=False)


def _result(content: Content | None) -> Content:
    """A tool result's content inside the tool_output block: a text, or with images its parts in
    order between the block's opening and closing text."""
    if content is None or isinstance(content, str):
        return RESULT_OPEN + (content or "") + RESULT_CLOSE
    return _parts_joined(
        [{"type": "text", "text": RESULT_OPEN}, *content, {"type": "text", "text": RESULT_CLOSE}], ""
    )


def _joined(first: Content, second: Content) -> Content:
    """Two contents as one turn's: texts a paragraph apart; with images, the parts in order, the
    texts that meet joined the same way (templates that trim each text part would glue them)."""
    if isinstance(first, str) and isinstance(second, str):
        return TURN_JOINER.join(t for t in (first, second) if t)
    return _parts_joined([*_parts(first), *_parts(second)], TURN_JOINER)


def _parts(content: Content) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content)


def _parts_joined(parts: list[dict[str, Any]], joiner: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        if part.get("type") == "text" and out and out[-1].get("type") == "text":
            out[-1] = {**out[-1], "text": joiner.join(t for t in (out[-1]["text"], part["text"]) if t)}
        else:
            out.append(part)
    return out
