"""The fenced blocks of a manual page that the docs test runs, and the skip convention.

A block runs if its fence names ``python``, ``pycon``, ``bash`` or ``console``; the line
``<!-- docs-test: skip (REASON) -->`` immediately before its fence skips it, and nothing else
does. Fences may be indented (inside a ``??? note`` admonition): the block is dedented."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

LANGUAGES = ("python", "pycon", "bash", "console")
_FENCE = re.compile(r"^(?P<indent> *)(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`\n]*)$")
_SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]*\S[^)]*)\)\s*-->\s*$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test\b")  # at a line's start: prose may quote one


class PageError(ValueError):
    """A page the harness cannot read as written (an unclosed fence, a malformed marker)."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int          # the line of the opening fence, 1-based
    language: str      # the fence's first word, lowercased
    source: str        # dedented, without the fences
    skip: str | None   # the reason of a skip marker right above the fence

    @property
    def runs(self) -> bool:
        return self.language in LANGUAGES and self.skip is None

    def where(self, root: Path | None = None) -> str:
        page = self.page.relative_to(root) if root else self.page
        return f"{page}:{self.line} ({self.language} block)"


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` in page order (runnable or not)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            if _MARKER.search(lines[i]) and not _SKIP.match(lines[i]):
                raise PageError(f"{page}:{i + 1}: malformed docs-test marker {lines[i].strip()!r}; "
                                "write <!-- docs-test: skip (REASON) --> right above a fence")
            i += 1
            continue
        indent, ticks = opening["indent"], opening["ticks"]
        language = (opening["info"].split() or [""])[0].lower().lstrip(".{")
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not re.match(rf"^ {{0,{len(indent) + 3}}}{re.escape(ticks)}\s*$",
                                               lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise PageError(f"{page}:{start + 1}: the fence opened here is never closed")
        i += 1
        before = lines[start - 1] if start else ""
        marker = _SKIP.match(before)
        if _MARKER.search(before) and language not in LANGUAGES:
            raise PageError(f"{page}:{start}: a docs-test marker above a {language or 'plain'} "
                            "block, which never runs")
        blocks.append(Block(page=page, line=start + 1, language=language,
                            source=textwrap.dedent("\n".join(body)) + "\n",
                            skip=marker["reason"].strip() if marker else None))
    return blocks
