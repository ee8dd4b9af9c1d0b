"""The gateway's tokenizers, loaded once per directory (and chat template) for the whole run.

Loading one is the gateway's start-up cost, paid once per model in a server; tests that build an app
or a helper per test paid it per test: seconds for a family's real tokenizer (transformers reads
Gemma 3's 33 MB tokenizer.json four times). Nothing the gateway does changes a loaded tokenizer
beyond the answers it caches, so tests share them.
"""

from __future__ import annotations

import functools
from pathlib import Path

from gateway.text.tokenizer import Tokenizer


def loaded_tokenizer(path: str | Path, chat_template_file: str | Path | None = None) -> Tokenizer:
    return _load(
        Path(path).resolve(), None if chat_template_file is None else Path(chat_template_file).resolve()
    )


@functools.cache
def _load(path: Path, chat_template_file: Path | None) -> Tokenizer:
    return Tokenizer(path, chat_template_file=chat_template_file)
