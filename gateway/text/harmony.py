"""gpt-oss's o200k-harmony encoding for ``openai-harmony``, built offline from a model's own
``tokenizer.json``.

openai-harmony loads the encoding's vocabulary from ``o200k_base.tiktoken``, which it downloads
unless ``TIKTOKEN_ENCODINGS_BASE`` names a folder that holds it. That file is the gpt-oss
``tokenizer.json``'s byte-level vocabulary written in tiktoken's format (base64 of each token's
bytes, then its rank), so it is written here from the served model's tokenizer, kept under the
gateway's cache folder, and checked against the sha256 the library expects: a model whose
vocabulary is not o200k-harmony is refused at start-up with one line.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Final

from gateway.errors import ServerConfigError

logger = logging.getLogger(__name__)

# What openai-harmony expects of o200k_base.tiktoken (it checks the same hash when it loads it).
O200K_BASE_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
TIKTOKEN_FILE: Final = "o200k_base.tiktoken"
# The formatting tokens of the harmony format, which the model's tokenizer must give the ids the
# encoding gives them (the text the parser reads is the model's decoding of its own ids).
MARKERS: Final = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
)

# TIKTOKEN_ENCODINGS_BASE is process-wide: one load at a time.
_LOADING = threading.Lock()


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet backwards: each printable stand-in character -> its byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def tiktoken_ranks(data: Any) -> bytes:
    """A byte-level BPE tokenizer.json's vocabulary (the parsed file) as a .tiktoken file (base64
    token, rank)."""
    model = data.get("model") or {}
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict):
        raise ValueError("not a byte-level BPE vocabulary")
    decoder = _byte_decoder()
    try:
        lines = [
            base64.b64encode(bytes(decoder[c] for c in token)).decode() + f" {rank}\n"
            for token, rank in sorted(vocab.items(), key=lambda item: item[1])
        ]
    except KeyError:
        raise ValueError("not a byte-level BPE vocabulary") from None
    return "".join(lines).encode()


def _refusal(tokenizer_dir: Path, why: str) -> ServerConfigError:
    return ServerConfigError(
        f"the harmony parser (gpt-oss) needs the o200k-harmony vocabulary of gpt-oss, but the "
        f"tokenizer in {tokenizer_dir} {why}",
        code="harmony_vocabulary_missing",
    )


def load_encoding(tokenizer_dir: str | Path, cache_dir: str | Path) -> Any:
    """openai-harmony's ``HarmonyGptOss`` encoding of the model in `tokenizer_dir` (its
    tokenizer.json must be o200k-harmony), its vocabulary file made once under `cache_dir`.
    Memoized: every model (and every app made in one process) with that tokenizer shares it."""
    return _load(Path(tokenizer_dir).resolve(), Path(cache_dir).resolve())


@functools.cache
def _load(tokenizer_dir: Path, cache_dir: Path) -> Any:
    import openai_harmony

    source = tokenizer_dir / "tokenizer.json"
    try:
        raw = source.read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError):
        raise _refusal(tokenizer_dir, "has no readable tokenizer.json") from None
    # Keyed by the tokenizer file, so a cached vocabulary is only ever the one this file gives.
    folder = cache_dir / "harmony" / hashlib.sha256(raw).hexdigest()[:32]
    cached = folder / TIKTOKEN_FILE
    if not cached.is_file():
        try:
            ranks = tiktoken_ranks(data)
        except ValueError as exc:
            raise _refusal(tokenizer_dir, f"is {exc}") from None
        if hashlib.sha256(ranks).hexdigest() != O200K_BASE_SHA256:
            raise _refusal(tokenizer_dir, "has another vocabulary")
        folder.mkdir(parents=True, exist_ok=True)
        # Written whole then renamed: a gateway starting beside this one never reads half a file.
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".part") as part:
            part.write(ranks)
        os.replace(part.name, cached)
        logger.info("harmony vocabulary written to %s", cached)
    with _LOADING:
        before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        try:
            encoding = openai_harmony.load_harmony_encoding(
                openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS
            )
        except Exception as exc:  # the library checks the file's hash: a changed cache file
            raise _refusal(tokenizer_dir, f"could not be loaded by openai-harmony ({exc})") from None
        finally:
            if before is None:
                os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
            else:
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = before
    vocab = {t["content"]: t["id"] for t in data.get("added_tokens", ())}
    for marker in MARKERS:
        if [vocab.get(marker)] != encoding.encode(marker, allowed_special={marker}):
            raise _refusal(tokenizer_dir, f"gives {marker} another id than o200k-harmony does")
    return encoding
