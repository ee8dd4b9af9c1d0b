"""The README's and the documentation's fenced code blocks, as the tests run and check them.

A block's language is its fence's info word; the line right before the fence may be a marker
`<!-- requires: VALUE -->` saying what the block needs that the test session does not have
(docs/contributing.md lists the values). Shell and Python blocks without a marker are run.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

SHELL = frozenset({"bash", "sh", "shell", "console"})
PYTHON = frozenset({"python", "py", "python3"})
RUNNABLE = SHELL | PYTHON
# What a marker may say; `stack-NAME` names a test stack other than the dev stack.
REQUIRES = frozenset({"gpu", "cluster", "network", "docker", "server", "long"})
_STACK = re.compile(r"^stack-[a-z0-9-]+$")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
_MARKER = re.compile(r"^\s*<!--\s*requires:\s*(?P<value>[^\s>]+)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it is, its language, its marker and its text (indent removed)."""

    path: Path
    line: int
    language: str
    requires: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUNNABLE and self.requires is None


def known_marker(value: str) -> bool:
    return value in REQUIRES or _STACK.match(value) is not None


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        fence, indent = match.group("fence"), len(match.group("indent"))
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            line = lines[j]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            j += 1
        yield Block(
            path=path,
            line=i + 1,
            language=match.group("info").lower(),
            requires=marker.group("value") if marker else None,
            text="\n".join(body) + "\n",
        )
        i = j + 1


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def prose(path: Path) -> str:
    """A page without its fenced blocks and HTML comments."""
    text = path.read_text(encoding="utf-8")
    out, inside, fence = [], False, ""
    for line in text.splitlines():
        match = _FENCE.match(line)
        if match is not None and (not inside or line.strip().startswith(fence)):
            inside, fence = (not inside), match.group("fence")
            continue
        if not inside:
            out.append(line)
    return re.sub(r"<!--.*?-->", "", "\n".join(out), flags=re.S)


def commands(script: str) -> Iterator[list[str]]:
    """Each simple command of a shell block, as words: continuation lines joined, comments dropped,
    split at `&&`, `||`, `;`, `|` and `&`, leading `VAR=value` assignments removed, here-documents
    skipped."""
    text = re.sub(r"\\\n", " ", script)
    text = re.sub(r"<<'?(\w+)'?\n.*?\n\1\n", "\n", text, flags=re.S)
    pending = ""
    for line in text.splitlines():
        # A quoted word may span lines (a JSON body): read on until the quotes close.
        pending = f"{pending}\n{line}" if pending else line
        try:
            lexer = shlex.shlex(pending, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words = list(lexer)
        except ValueError:
            continue
        pending = ""
        current: list[str] = []
        for word in [*words, ";"]:
            if word and set(word) <= set(";&|"):
                while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    yield current
                current = []
            else:
                current.append(word)
