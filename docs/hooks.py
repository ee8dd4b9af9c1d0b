"""MkDocs hook: each `<!-- reference: NAME -->` line of a page becomes the table the code makes
(gateway.reference), so the settings, model keys and metrics pages are never kept by hand."""

from __future__ import annotations

from typing import Any

from gateway.reference import expand


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return expand(markdown)
