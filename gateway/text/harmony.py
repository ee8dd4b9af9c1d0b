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
    source = tokenizer_dir / "tokenizer.json"
    try:
        raw = source.read_bytes()
    except OSError:
        raise _refusal(tokenizer_dir, "has no readable tokenizer.json") from None
    # Keyed by the tokenizer file: a cached vocabulary is only ever the one this file gave, and it
    # is kept only once every check below passed, so a cached one needs no reading of the file.
    folder = cache_dir / "harmony" / hashlib.sha256(raw).hexdigest()[:32]
    cached = folder / TIKTOKEN_FILE
    if cached.is_file():
        return _load_from(folder, tokenizer_dir)
    try:
        data = json.loads(raw)
    except ValueError:
        raise _refusal(tokenizer_dir, "has no readable tokenizer.json") from None
    try:
        ranks = tiktoken_ranks(data)
    except ValueError as exc:
        raise _refusal(tokenizer_dir, f"is {exc}") from None
    if hashlib.sha256(ranks).hexdigest() != O200K_BASE_SHA256:
        raise _refusal(tokenizer_dir, "has another vocabulary")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return _keep(folder, ranks, data, tokenizer_dir)
    except OSError as exc:
        raise ServerConfigError(
            f"cannot keep the harmony vocabulary under {cache_dir} (set --state-dir): {exc.strerror or exc}",
            code="harmony_cache_unwritable",
        ) from None


def _keep(folder: Path, ranks: bytes, data: Any, tokenizer_dir: Path) -> Any:
    """Load the encoding from `ranks`, check the model's marker ids against it, and only then put
    the file in place for the next start."""
    cached = folder / TIKTOKEN_FILE
    with tempfile.TemporaryDirectory(dir=folder) as staging:
        (Path(staging) / TIKTOKEN_FILE).write_bytes(ranks)
        encoding = _load_from(Path(staging), tokenizer_dir)
        vocab = {t["content"]: t["id"] for t in data.get("added_tokens", ())}
        for marker in MARKERS:
            if [vocab.get(marker)] != encoding.encode(
                marker, allowed_special={marker}, disallowed_special=()
            ):
                raise _refusal(tokenizer_dir, f"gives {marker} another id than o200k-harmony does")
        # Renamed into place whole: a gateway starting beside this one never reads half a file.
        os.replace(Path(staging) / TIKTOKEN_FILE, cached)
    logger.info("harmony vocabulary written to %s", cached)
    return encoding


def _load_from(folder: Path, tokenizer_dir: Path) -> Any:
    import openai_harmony

    with _LOADING:
        before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        try:
            return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
        except Exception as exc:  # the library checks the file's hash: a changed cache file
            raise _refusal(tokenizer_dir, f"could not be loaded by openai-harmony ({exc})") from None
        finally:
            if before is None:
                os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
            else:
                os.environ["TIKTOKEN_ENCODINGS_BASE"] = before
