"""Chat templates rendered as transformers' `apply_chat_template(tokenize=False)` renders them, with
an agent's tool list prepared once instead of on every request.

An agent sends the same tool list (tens of kilobytes of JSON schemas) with every turn. transformers
copies it into plain data on each render (`_plain_template_data`, a Python walk over every value)
and the template serializes each tool again (`tool | tojson`): at 60k tokens with ~90 tools that
was about 85% of Qwen3's render. Here a tool list is looked up by its JSON text: the plain copy
made the first time is reused, and `tojson` of any list or dict inside it is remembered (the same
object with the same arguments, so the same text). Templates cannot change what they are given
(transformers renders them in Jinja's immutable sandbox), so a remembered result stays exact.

Everything else is transformers' own code, called in the order `apply_chat_template` calls it
(its template compiler with the `tojson`, `raise_exception` and `strftime_now` helpers, the plain
copies of messages and arguments, the reasoning field aliases). Calls this does not cover
(documents, continuing the final message, anything unusual) go to transformers itself, and a
renderer is only used after it reproduced transformers' render on probe conversations at
start-up.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

logger = logging.getLogger(__name__)

# Tool lists remembered per model: an agent deployment sees few distinct ones (one per agent
# version), each tens of kilobytes.
TOOL_LISTS = 32

_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city (°C), 'quoted' \"text\" and <tags>",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 3}},
                "required": ["city"],
            },
        },
    }
]
_PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Weather in Paris? ünïcödé 数字"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "Thanks!"},
]


class _ToolLists:
    """Tool lists by their JSON text -> the plain copy templates get, and the `tojson` results of
    the lists and dicts inside those copies (by object identity)."""

    def __init__(self, plain: Callable[[Any], Any], capacity: int = TOOL_LISTS) -> None:
        self._plain = plain
        self._capacity = capacity
        self._lists: OrderedDict[bytes, tuple[Any, list[int]]] = OrderedDict()
        # id(container) -> (the container, its tojson results by arguments). Holding the container
        # keeps its id from being reused while the entry exists.
        self.frozen: dict[int, tuple[Any, dict[Any, str]]] = {}
        self._lock = threading.Lock()

    def get(self, tools: list[Any]) -> Any:
        try:
            key = orjson.dumps(tools)
        except TypeError:  # not plain JSON (transformers copies it, with its placeholders)
            return self._plain(tools)
        with self._lock:
            found = self._lists.get(key)
            if found is not None:
                self._lists.move_to_end(key)
                return found[0]
        copy = self._plain(tools)
        containers = _containers(copy)
        if containers is None:
            return copy
        with self._lock:
            found = self._lists.get(key)
            if found is not None:  # another thread made it meanwhile
                return found[0]
            for value in containers:
                self.frozen[id(value)] = (value, {})
            self._lists[key] = (copy, [id(v) for v in containers])
            while len(self._lists) > self._capacity:
                _, (_, old_ids) = self._lists.popitem(last=False)
                for i in old_ids:
                    del self.frozen[i]
        return copy

    def tojson(self, original: Callable[..., str]) -> Callable[..., str]:
        frozen = self.frozen

        def tojson(value: Any, *args: Any, **kwargs: Any) -> str:
            entry = frozen.get(id(value))
            if entry is None or entry[0] is not value:
                return original(value, *args, **kwargs)
            try:
                key = (args, tuple(sorted(kwargs.items())))
                text = entry[1].get(key)
            except TypeError:  # unhashable arguments (separators as a list)
                return original(value, *args, **kwargs)
            if text is None:
                text = original(value, *args, **kwargs)
                entry[1][key] = text
            return text

        return tojson


def _containers(value: Any) -> list[Any] | None:
    """The lists and dicts in a plain copy, or None where its JSON text would not tell it from
    another value (a tuple is written as a list, NaN and infinities as null)."""
    out = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, tuple) or (isinstance(item, float) and not math.isfinite(item)):
            return None
        else:
            continue
        out.append(item)
    return out


class ChatRenderer:
    """`apply_chat_template(messages, tokenize=False, ...)` of one transformers tokenizer."""

    def __init__(self, tok: Any, chat_template: str | None) -> None:
        from transformers.utils import chat_template_utils as ctu

        self._tok = tok
        self._configured = chat_template
        self._compile: Callable[[str], Any] = ctu._cached_compile_jinja_template
        self._plain: Callable[[Any], Any] = ctu._plain_template_data
        self._alias: Callable[[Any], Any] = ctu._alias_reasoning_fields
        # apply_chat_template's own parameters: a template argument of that name means something
        # else to it, so such a call is left to transformers.
        self._reserved = frozenset(inspect.signature(tok.apply_chat_template).parameters) - {"tools"}
        self._tools = _ToolLists(self._plain)
        self._templates: dict[str, Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def checked(cls, tok: Any, chat_template: str | None) -> ChatRenderer | None:
        """A renderer that gave transformers' own render on the probe conversations (with and
        without tools, twice each: the second from the remembered tool list), else None."""
        try:
            renderer = cls(tok, chat_template)
            for tools in (None, _PROBE_TOOLS, _PROBE_TOOLS):
                for messages in (_PROBE_MESSAGES[:2], _PROBE_MESSAGES):
                    want = _transformers(tok, chat_template, messages, tools)
                    if want is None:
                        continue  # the template refuses it: nothing to compare
                    got = renderer.render(messages, add_generation_prompt=True, tools=tools)
                    if got != want:
                        logger.warning("chat template renders differently here: rendered by transformers")
                        return None
        except Exception as exc:  # an unexpected transformers version: its own render is used
            logger.warning("chat template renderer unavailable (%s): rendering through transformers", exc)
            return None
        return renderer

    def _template(self, tools: Any) -> Any:
        source = self._tok.get_chat_template(self._configured, tools)
        compiled = self._templates.get(source)
        if compiled is None:
            with self._lock:
                compiled = self._templates.get(source)
                if compiled is None:
                    compiled = self._compile(source)
                    environment = compiled.environment
                    environment.filters["tojson"] = self._tools.tojson(environment.filters["tojson"])
                    self._templates[source] = compiled
        return compiled

    def handles(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> bool:
        """Whether `render` covers this call (else transformers renders it)."""
        if not messages or not self._reserved.isdisjoint(kwargs):
            return False
        tools = kwargs.get("tools")
        return tools is None or (isinstance(tools, list) and all(isinstance(t, dict) for t in tools))

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool, **kwargs: Any) -> str:
        """As `apply_chat_template(messages, tokenize=False, add_generation_prompt=..., **kwargs)`
        where `handles` says so; raises what the template raises."""
        tools = kwargs.pop("tools", None)
        compiled = self._template(tools)
        # What apply_chat_template does before rendering, in its order: drop None values, special
        # tokens as arguments under the caller's, then plain copies of everything.
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        template_kwargs = self._plain({**self._tok.special_tokens_map, **kwargs})
        tool_schemas = None if tools is None else self._tools.get(tools)
        chat = self._alias(self._plain(chat))
        return str(
            compiled.render(
                messages=chat,
                tools=tool_schemas,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
        )


def _transformers(
    tok: Any, chat_template: str | None, messages: list[dict[str, Any]], tools: Any
) -> str | None:
    try:
        return str(
            tok.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True, chat_template=chat_template
            )
        )
    except Exception:
        return None
