"""The model's tokenizer as the gateway uses it: encoding, chat templates, end ids, context length.

Only `transformers`' tokenizer classes are used here, never its models: the gateway needs no torch
(its image has none). Where torch is installed anyway (the dev venv, for the CPU engine),
transformers' AutoTokenizer imports it; the app freezes that start-up heap out of the GC's way.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import InvalidRequestError, ServerConfigError
from gateway.text.encoding import INLINE_CHARS, PromptEncoder
from gateway.text.template import ChatRenderer

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Chat messages with more text than this are rendered on a thread: a template's loops over a long
# conversation take milliseconds (about 9 ms for 200 kB with Qwen3's), too long for the event loop.
RENDER_INLINE_CHARS = 8192

logger = logging.getLogger(__name__)

# The conversation `renders_tool_results` and `renders_tool_calls` probe a template with: markers no
# template writes by itself. The call id is nine letters and digits, the only ids Mistral's
# templates take (any other template takes them too).
_PROBE_CALL_ID = "pr0be1d42"
_PROBE_RESULT = "tool-result-marker-5f3a"
_PROBE_ARGUMENT = "argument-marker-5f3a"
_PROBE_SYSTEM = "system-marker-5f3a"
_PROBE_LATE_SYSTEM: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "Hi."},
    {"role": "assistant", "content": "Hello."},
    {"role": "system", "content": _PROBE_SYSTEM},
    {"role": "user", "content": "Go on."},
)
_PROBE_CALL_TURNS: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "Call the tool."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": _PROBE_CALL_ID,
                "type": "function",
                "function": {"name": "probe_tool", "arguments": {"value": _PROBE_ARGUMENT}},
            }
        ],
    },
)
_PROBE_TOOL_TURN: dict[str, Any] = {"role": "tool", "tool_call_id": _PROBE_CALL_ID, "content": _PROBE_RESULT}


@dataclass(frozen=True, slots=True)
class ModelTextInfo:
    """What the gateway learns from a Hugging Face model directory."""

    eos_token_id: int | None
    pad_token_id: int | None
    # End ids besides the primary eos (generation_config lists, e.g. Llama 3's <|eot_id|>).
    extra_end_ids: tuple[int, ...]
    extra_end_tokens: tuple[str, ...]
    max_model_len: int | None
    # The model's vocabulary (logits) size: config.json's vocab_size, often padded past the tokenizer's.
    model_vocab_size: int | None = None


# What AutoTokenizer loads a tokenizer from: a fast tokenizer's JSON, a SentencePiece or
# tiktoken model, BPE vocab files, or a config naming the tokenizer class.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "tiktoken.model",
)


def check_tokenizer_files(path: str | Path, chat_template_file: str | Path | None = None) -> str | None:
    """The tokenizer directory holds a tokenizer and the chat template file reads as text (which
    it returns). Cheap, and free of transformers (seconds to import), so start-up runs it first."""
    directory = Path(path)
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise ServerConfigError(f"tokenizer directory {directory} {what}")
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise ServerConfigError(
            f"tokenizer directory {directory} has no tokenizer (none of {', '.join(_TOKENIZER_FILES)}): "
            "give a local Hugging Face model or tokenizer directory"
        )
    if chat_template_file is None:
        return None
    try:
        return Path(chat_template_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ServerConfigError(
            f"chat template {chat_template_file}: {exc.strerror or exc}"
            if isinstance(exc, OSError)
            else f"chat template {chat_template_file} is not UTF-8 text"
        ) from None


def keep_torch_out() -> None:
    """Have transformers run without torch in this process: a server's, which needs tokenizers,
    chat templates and image processors only, as the gateway's images (which have no torch) run it.

    Where torch is installed (a development environment), transformers imports it with
    `AutoTokenizer` (its configuration module does): seconds of CPU at every start and hundreds of
    MB in every worker. `sys.modules["torch"] = None` makes `importlib.util.find_spec` answer that
    there is no torch, so transformers takes the path it takes without it. Done only before
    transformers is imported (it decides once), never once torch is, and not in a process that
    needs torch (models are built in processes of their own: `python -m deploy.tiny_model`)."""
    if "torch" in sys.modules or "transformers" in sys.modules:
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    # Its notice that models are unavailable without torch is no news to a server.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


class Tokenizer:
    """Wraps a Hugging Face fast tokenizer loaded from a local directory."""

    def __init__(self, path: str | Path, *, chat_template_file: str | Path | None = None) -> None:
        self.path = Path(path)
        self._chat_template: str | None = check_tokenizer_files(self.path, chat_template_file)
        from transformers import AutoTokenizer

        try:
            self._tok: Any = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        except Exception as exc:  # transformers raises many kinds, each a long story
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ServerConfigError(f"cannot load the tokenizer in {self.path}: {first}") from exc
        self.info = _read_model_info(self.path, self._tok)
        self.vocab_size = len(self._tok)
        # Held around encode_pair, whose truncation is a setting of the shared Rust tokenizer
        # (set, then encode): one thread's setting must not apply to another's text, nor be changed
        # while another encodes (tokenizers raises "Already borrowed"). Re-entrant, so a caller may
        # hold it over several pairs.
        self.pair_lock = threading.RLock()
        # The Rust tokenizer behind a fast tokenizer does the same work without transformers'
        # per-call Python overhead, which matters twice per streamed token. Only when transformers
        # would not post-process its output (space clean-up) are the two interchangeable.
        backend = getattr(self._tok, "_tokenizer", None)
        clean_up = bool(getattr(self._tok, "clean_up_tokenization_spaces", False))
        self._backend: Any = backend if backend is not None and not clean_up else None
        # Prompts are encoded by the Rust tokenizer itself where it gives transformers' ids (checked
        # on probe texts): piece by piece with a cache, long ones on threads (text.encoding).
        self.encoder: PromptEncoder | None = None
        if backend is not None and _same_ids(self._tok, backend):
            self.encoder = PromptEncoder(backend)
        self._anchor = self.encode("a", add_special_tokens=False)[:1]
        self._token_texts: dict[int, str] = {}
        # Byte-level BPE (GPT-2, Llama 3, Qwen, ...): streamed text is then one table look-up per
        # token instead of two decodes (see text.detokenizer.ByteTableDecoder).
        self.token_bytes: tuple[bytes, ...] | None = (
            byte_level_table(self._backend) if self._backend is not None else None
        )
        # SentencePiece byte-fallback tokens (`<0xNN>`): their runs decode as one UTF-8 string.
        self.byte_fallback_ids: frozenset[int] = frozenset(
            i for token, i in self._tok.get_vocab().items() if _BYTE_TOKEN.fullmatch(token)
        )
        self.special_ids: frozenset[int] = frozenset(int(i) for i in self._tok.all_special_ids)
        # See token_bound: the special tokens the template adds to any text, if the bound holds.
        self._specials_added: int | None = None
        if self._backend is not None and self.token_bytes is not None and _one_symbol_per_byte(self._backend):
            self._specials_added = len(self._backend.encode("", add_special_tokens=True).ids)
        how = "by byte table" if self.token_bytes else "by window"
        logger.debug("%s: streamed text decoded %s", path, how)

    @functools.cached_property
    def token_bytes_with_special(self) -> tuple[bytes, ...] | None:
        """`token_bytes` with the special tokens' text in it (decoding with special tokens kept);
        made on first use, for the models whose reasoning markers are special tokens."""
        if self.token_bytes is None:
            return None
        return byte_level_table(self._backend, keep_special=True)

    @functools.cached_property
    def vocab(self) -> dict[str, int]:
        """Token string -> id, added tokens included (made on first use: a large vocabulary is a
        large dict)."""
        return dict(self._tok.get_vocab())

    @functools.cached_property
    def skipped_tokens(self) -> frozenset[str]:
        """The tokens a decode with special tokens skipped leaves out (the added tokens marked
        special): a parser whose markers are among them needs special tokens kept."""
        return frozenset(str(t.content) for t in self._tok.added_tokens_decoder.values() if t.special)

    @functools.cached_property
    def special_affixes(self) -> tuple[str, str]:
        """The special tokens encoding adds before and after any text (add_special_tokens), as
        their text: ("<s>", "") for Llama 2, ("", "") for Qwen3 or gpt-oss."""
        plain = self.encode("a", add_special_tokens=False)
        full = self.encode("a", add_special_tokens=True)
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain:
                before, after = full[:start], full[start + len(plain) :]
                return "".join(self.convert_ids_to_tokens(before)), "".join(self.convert_ids_to_tokens(after))
        return "", ""

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the chat template reads `tools` (the one transformers renders a request with
        tools by: the configured file, else the tokenizer's `tool_use` template or its default)."""
        template: Any = self._chat_template or getattr(self._tok, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("tool_use") or template.get("default")
        if not isinstance(template, str):
            return False
        return "tools" in template_variables(template)

    @functools.cached_property
    def renders_images(self) -> bool:
        """Whether the chat template writes something for an image part (`{"type": "image"}`,
        the Hugging Face convention): a template that ignores them would drop a request's images
        without a word. Probed once by rendering a turn with and without one."""
        if not self.has_chat_template:
            return False
        text = {"type": "text", "text": "Describe this."}
        try:
            with_image = self.apply_chat_template([{"role": "user", "content": [text, {"type": "image"}]}])
            without = self.apply_chat_template([{"role": "user", "content": [text]}])
        except Exception:  # a template that needs more than one user turn: it cannot be probed
            return True
        return with_image != without

    @functools.cached_property
    def renders_tool_results(self) -> bool:
        """Whether the chat template writes a `tool` turn's content (Qwen3's, Llama 3.1's, DeepSeek
        V3's, gpt-oss's, Mistral's do; Gemma 3's and Llama 2's refuse the role). Probed once by
        rendering a marker; a template that raises on the probe does not."""
        return _PROBE_RESULT in self._probe_tool_turns((_PROBE_TOOL_TURN,))

    @functools.cached_property
    def renders_tool_calls(self) -> bool:
        """Whether the chat template writes an assistant turn's `tool_calls` as the gateway hands
        them over (content "", arguments as an object): templates that never read them drop them
        without a word. Probed once by rendering a marker in a call's arguments (what the call
        says; a template may leave the name to the tool turn), followed by a tool turn or, for
        templates that take no tool turn, by a user turn."""
        rendered = self._probe_tool_turns((_PROBE_TOOL_TURN, {"role": "user", "content": "Go on."}))
        return _PROBE_ARGUMENT in rendered

    @functools.cached_property
    def renders_late_system(self) -> bool:
        """Whether the chat template writes a system turn that is not the first message (Qwen3's,
        Llama 3.1's do; Gemma 3's refuses one). Probed once by rendering a marker; a template that
        raises on the probe does not."""
        if not self.has_chat_template:
            return True
        return _PROBE_SYSTEM in self._probe([list(_PROBE_LATE_SYSTEM)])

    def _probe_tool_turns(self, endings: Sequence[dict[str, Any]]) -> str:
        """The renders of the probe conversation (a user turn, an assistant turn with a call) with
        each ending in turn, joined; those the template refuses left out."""
        return self._probe([[*_PROBE_CALL_TURNS, ending] for ending in endings])

    def _probe(self, conversations: Sequence[list[dict[str, Any]]]) -> str:
        """The renders of probe conversations, joined; those the template refuses left out."""
        if not self.has_chat_template:
            return ""
        rendered = []
        for messages in conversations:
            try:
                rendered.append(self.apply_chat_template(messages))
            except Exception:  # jinja raises arbitrary errors: the template does not take it
                continue
        return "\n".join(rendered)

    @property
    def chat_template(self) -> str | None:
        """The chat template in use: the configured file's, else the tokenizer's (its default one
        where it ships several by name)."""
        if self._chat_template is not None:
            return self._chat_template
        template = getattr(self._tok, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default")
        return template if isinstance(template, str) else None

    @property
    def has_chat_template(self) -> bool:
        return self._chat_template is not None or bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`, on the calling thread (short texts, and callers that cannot wait)."""
        if self.encoder is not None:
            return self.encoder.encode_now(text, add_special_tokens=add_special_tokens)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_pair(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_length: int | None = None,
        add_special_tokens: bool = True,
    ) -> tuple[list[int], list[int]]:
        """A text, or a pair of texts (a cross-encoder's query and document), with the tokenizer's
        special tokens (unless `add_special_tokens` is false) and token types; cut to `max_length`
        as the tokenizer truncates (the longer text first, special tokens kept)."""
        kwargs: dict[str, Any] = {"truncation": True, "max_length": max_length} if max_length else {}
        with self.pair_lock:
            out = self._tok(
                text, pair, return_token_type_ids=True, add_special_tokens=add_special_tokens, **kwargs
            )
        ids = list(out["input_ids"])
        types = out.get("token_type_ids")
        return ids, list(types) if types is not None else [0] * len(ids)

    async def encode_async(self, text: str, *, add_special_tokens: bool = True) -> Sequence[int]:
        """The ids of `text`, exactly `encode`'s, without holding the event loop for a long text:
        its known pieces come from the cache and its new ones are encoded on a thread. A long
        text's come as TokenIds (one int32 array, text.ids)."""
        if self.encoder is not None:
            return await self.encoder.encode(text, add_special_tokens=add_special_tokens)
        if len(text) <= INLINE_CHARS:
            return self.encode(text, add_special_tokens=add_special_tokens)
        # transformers' own encode holds the GIL; a thread still lets the loop run between slices.
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.encode(text, add_special_tokens=add_special_tokens)
        )

    def token_bound(self, text: str, *, add_special_tokens: bool = True) -> int | None:
        """At most how many tokens `text` encodes to, found without encoding it; None where this
        tokenizer gives no such bound (and for empty text).

        Byte-level BPE with no normalizer turns each byte of the text into one symbol (one more
        for a prefix space) and every token spans at least one symbol; the template adds a fixed
        number of special tokens. So the core can know a prompt is within every limit
        before paying for its encoding."""
        if self._specials_added is None or not text:
            return None
        return len(text.encode()) + 1 + (self._specials_added if add_special_tokens else 0)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self._backend is not None:
            return str(self._backend.decode(ids, skip_special_tokens=skip_special_tokens))
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_text(self, token_id: int, *, starts_text: bool = False) -> str:
        """The text one token adds, as logprobs show it: decoded after an anchor token so that
        SentencePiece keeps the token's leading space (alone it would be dropped); `starts_text`:
        the token begins the text, where the decoder drops that space (Llama 2), so it is
        decoded alone."""
        if starts_text:
            return self.decode([token_id], skip_special_tokens=False)
        cached = self._token_texts.get(token_id)
        if cached is None:
            anchor = self._anchor
            full = self.decode([*anchor, token_id], skip_special_tokens=False)
            cached = full[len(self.decode(anchor, skip_special_tokens=False)) :]
            self._token_texts[token_id] = cached
        return cached

    def token_raw_bytes(self, token_id: int, *, starts_text: bool = False) -> bytes:
        """The exact bytes one token adds to the output, also where they are not whole UTF-8
        characters: from the byte table (byte-level BPE), a byte-fallback piece (`<0xNN>`), or
        else the token's text."""
        table = self.token_bytes
        if table is not None and 0 <= token_id < len(table) and table[token_id]:
            return table[token_id]  # (special tokens have none there: they are their text)
        piece = self.convert_ids_to_tokens([token_id])[0]
        if isinstance(piece, str) and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return self.token_text(token_id, starts_text=starts_text).encode()

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return list(self._tok.convert_ids_to_tokens(list(ids)))

    async def render_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        """`apply_chat_template`, on a thread when the messages hold much text (the template is
        Python code: the loop then gets the GIL back every switch interval instead of waiting for
        the whole render)."""
        if _text_size(messages, kwargs) <= RENDER_INLINE_CHARS:
            return self.apply_chat_template(messages, **kwargs)
        pool = self.encoder.pool if self.encoder is not None else None
        return await asyncio.get_running_loop().run_in_executor(
            pool, lambda: self.apply_chat_template(messages, **kwargs)
        )

    @functools.cached_property
    def _renderer(self) -> ChatRenderer | None:
        """transformers' render with an agent's tool list prepared once (text.template); made and
        checked against transformers on first use."""
        if not self.has_chat_template:
            return None
        return ChatRenderer.checked(self._tok, self._chat_template)

    @functools.cached_property
    def bos_token(self) -> str | None:
        """The text of the tokenizer's beginning-of-sequence token, if it has one."""
        token = getattr(self._tok, "bos_token", None)
        return str(token) if token else None

    def apply_chat_template(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if not self.has_chat_template:
            raise InvalidRequestError(
                "this model has no chat template; use /v1/completions or configure a chat template file",
                param="messages",
            )
        if kwargs.get("tools") and not self.renders_tools:
            # transformers would render the prompt without them: the model would never see the tools.
            raise InvalidRequestError(
                "this model's chat template does not render tools, so the model would never see "
                "them: serve it with a chat template that does (chat_template=FILE), or force a call "
                "with tool_choice 'required' or a named function",
                param="tools",
            )
        try:
            renderer = self._renderer
            if renderer is not None and renderer.handles(messages, kwargs):
                rendered = renderer.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
            else:
                rendered = self._tok.apply_chat_template(
                    messages,
                    tokenize=False,
                    add_generation_prompt=add_generation_prompt,
                    chat_template=self._chat_template,
                    **kwargs,
                )
        except Exception as exc:  # jinja raises arbitrary errors from template code
            raise InvalidRequestError(
                f"the chat template rejected the messages: {exc}", param="messages"
            ) from None
        return str(rendered)


def _text_size(messages: list[dict[str, Any]], kwargs: Mapping[str, Any]) -> int:
    """About how much text a render writes, counted cheaply: the messages' string contents, and
    any tool list counted as long (an agent's tools are thousands of tokens)."""
    size = sum(len(c) for m in messages if isinstance(c := m.get("content"), str))
    return size + (RENDER_INLINE_CHARS + 1 if kwargs.get("tools") else 0)


_ENCODE_PROBES = ("Hello, world!", " two  spaces\nand a line", "ünïcödé 数字 123456", "")


def _same_ids(tok: Any, backend: Any) -> bool:
    """Whether the Rust tokenizer gives transformers' ids (transformers may add its own
    post-processing for some tokenizer classes)."""
    for text in _ENCODE_PROBES:
        for special in (False, True):
            if list(backend.encode(text, add_special_tokens=special).ids) != list(
                tok.encode(text, add_special_tokens=special)
            ):
                return False
    return True


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The variables a chat template reads from its context, parsed as transformers compiles it
    (its extensions included); a template that does not parse reads none."""
    import jinja2.meta
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        environment = _compile_jinja_template(template).environment
        return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(template)))
    except Exception:  # the template's own error is the request's 400, at render time
        return frozenset()


def _one_symbol_per_byte(backend: Any) -> bool:
    """Whether encoding works on the text's bytes as they are: a BPE model behind a byte-level
    pre-tokenizer, with no normalizer (NFKC and others can lengthen text) and no truncation."""
    from tokenizers import models

    pre = backend.pre_tokenizer
    return (
        backend.normalizer is None
        and backend.truncation is None
        and isinstance(backend.model, models.BPE)
        and pre is not None
        and b'"ByteLevel"' in pre.__getstate__()
    )


def _byte_level_alphabet() -> dict[str, int]:
    # GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes stand for themselves, the other
    # 68 bytes for U+0100 onwards, in byte order.
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(0x100 + i): b for i, b in enumerate(others)}}


def _byte_level_translation() -> dict[int, int]:
    """A `str.translate` table taking each alphabet character to the Latin-1 character of its byte
    and every other character below U+0100 to U+FFFF, so a token encodes to Latin-1 (its bytes)
    exactly when all of its characters are in the alphabet: a loop in C over the vocabulary, where a
    Python loop per character took a second of start-up on a 200k vocabulary."""
    alphabet = _byte_level_alphabet()
    outside = {b: 0xFFFF for b in range(0x100) if chr(b) not in alphabet}
    return {**outside, **{ord(ch): b for ch, b in alphabet.items()}}


def byte_level_table(backend: Any, *, keep_special: bool = False) -> tuple[bytes, ...] | None:
    """Each token's exact bytes (special tokens none, or their text with `keep_special`), when the
    tokenizer decodes a sequence as nothing but the UTF-8 decoding of its tokens' bytes joined: a
    byte-level decoder, alone.

    Every entry is checked against the tokenizer's own decoding of that token, so a tokenizer whose
    decoding this does not reproduce exactly gets None (and the gateway decodes by window instead).
    """
    from tokenizers import decoders

    if type(backend.decoder) is not decoders.ByteLevel:
        return None
    to_bytes = _byte_level_translation()
    skipped = (
        set() if keep_special else {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    )
    size = backend.get_vocab_size(with_added_tokens=True)
    table: list[bytes] = []
    for token_id in range(size):
        token = backend.id_to_token(token_id)
        if token is None or token_id in skipped:
            table.append(b"")
            continue
        try:
            table.append(token.translate(to_bytes).encode("latin-1"))
        except UnicodeEncodeError:
            # The byte-level decoder passes a token outside its alphabet (an added token) through.
            table.append(token.encode())
    decoded = backend.decode_batch([[i] for i in range(size)], skip_special_tokens=not keep_special)
    if any(d != b.decode("utf-8", "replace") for d, b in zip(decoded, table, strict=True)):
        return None
    return tuple(table)


def _read_model_info(path: Path, tok: Any) -> ModelTextInfo:
    gen = _read_json(path / "generation_config.json")
    cfg = _read_json(path / "config.json")
    eos = tok.eos_token_id
    end_ids: list[int] = []
    for source in (gen.get("eos_token_id"), cfg.get("eos_token_id")):
        if isinstance(source, int):
            end_ids.append(source)
        elif isinstance(source, list):
            end_ids.extend(i for i in source if isinstance(i, int))
    if eos is None and end_ids:
        eos = end_ids[0]
    extra = tuple(dict.fromkeys(i for i in end_ids if i != eos))
    extra_tokens = tuple(str(t) for t in tok.convert_ids_to_tokens(list(extra)))
    max_len: int | None = None
    # A vision-language checkpoint's limits are its text model's (transformers' get_text_config()).
    text_cfg = cfg.get("text_config")
    for source in (cfg, text_cfg if isinstance(text_cfg, dict) else {}):
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            if isinstance(source.get(key), int):
                max_len = int(source[key])
                break
        if max_len is not None:
            break
    if max_len is None:
        tml = getattr(tok, "model_max_length", None)
        # transformers uses a huge sentinel when the tokenizer does not know its length.
        if isinstance(tml, int) and tml < 10_000_000:
            max_len = tml
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    return ModelTextInfo(
        eos_token_id=eos,
        pad_token_id=pad,
        extra_end_ids=extra,
        extra_end_tokens=extra_tokens,
        max_model_len=max_len,
        model_vocab_size=cfg["vocab_size"] if isinstance(cfg.get("vocab_size"), int) else None,
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable %s: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}
