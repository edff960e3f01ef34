"""Parsing JSON that comes from outside the process (a model folder, a store object, a memo file,
a server's answer, a shard header) with a bound on its nesting.

``json.loads`` recurses once per level: 100,000 nested brackets raise ``RecursionError``, which
no caller expects. :func:`loads` refuses JSON nested deeper than :data:`MAX_DEPTH` with a
``ValueError`` (what every caller already turns into its typed error), before parsing it. Bytes
are strict UTF-8 (no other encoding is guessed; a BOM is not JSON).
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class TooDeepError(ValueError):
    """JSON nested deeper than the bound."""


def loads(data: str | bytes | bytearray, *, max_depth: int | None = MAX_DEPTH,
          **options: Any) -> Any:
    """``json.loads(data, **options)``, refused (:class:`TooDeepError`) when nested deeper than
    ``max_depth``; bytes that are not UTF-8 raise ``UnicodeDecodeError`` (a ValueError).

    ``max_depth=None`` skips the scan (it costs about what parsing does) and bounds the depth by
    the interpreter's recursion limit only: for JSON whose schema is checked right after and
    admits no depth (a shard header, read on every pull)."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    if max_depth is not None:
        check_depth(text, max_depth)
    try:
        return json.loads(text, **options)
    except RecursionError:  # a bound the scan missed is still a bound
        raise TooDeepError(f"JSON nested deeper than {max_depth or 'the recursion limit'} "
                           "levels") from None


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse ``text`` if its brackets (outside strings) nest deeper than ``max_depth``."""
    if text.count("[") + text.count("{") <= max_depth:
        return  # too few brackets to nest that deep
    brackets = _STRING.sub("", text).encode("utf-8", "replace").translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):  # each pass removes the innermost level
        if not brackets:
            return
        inner = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if inner == brackets:
            return  # unbalanced: the parser reports it
        brackets = inner
    if brackets:
        raise TooDeepError(f"JSON nested deeper than {max_depth} levels")
