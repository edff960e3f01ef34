"""Parsing JSON that comes from outside the process (a model folder, a store object, a memo file,
a server's answer, a shard header) with a bound on its size and its nesting.

``json.loads`` recurses once per level: 100,000 nested brackets raise ``RecursionError``, which
no caller expects. :func:`loads` refuses JSON nested deeper than :data:`MAX_DEPTH` with a
``ValueError`` (what every caller already turns into its typed error), before parsing it, and
JSON longer than ``max_bytes`` before reading a character of it. Bytes are strict UTF-8 (no other
encoding is guessed; a BOM is not JSON).

Every step is linear in the input, whatever it holds. The depth scan drops strings with one
pattern that cannot backtrack: from a ``"`` it always matches (to the closing quote, or to the end
of an unterminated string), with possessive loops over disjoint alternatives, so each character
is looked at once; the bracket pass then peels at most ``max_depth`` levels, each a C-speed
``bytes.replace``. (The pattern this replaces failed on an unterminated string of escaped quotes
and was retried from every quote inside it: quadratic, holding the GIL.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

MAX_DEPTH = 64

# A JSON string from its opening quote: to its closing quote, or (unterminated) to the end.
# ``*+`` is possessive: having matched, the loop never gives characters back, and since the tail
# matches whatever follows the loop, a match attempt starting at a quote never fails.
STRING = re.compile(r'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class TooDeepError(ValueError):
    """JSON nested deeper than the bound."""


class TooLargeError(ValueError):
    """JSON longer than the bound."""


def loads(data: str | bytes | bytearray, *, max_depth: int | None = MAX_DEPTH,
          max_bytes: int | None = None, **options: Any) -> Any:
    """``json.loads(data, **options)``, refused (:class:`TooDeepError`) when nested deeper than
    ``max_depth`` and (:class:`TooLargeError`) when longer than ``max_bytes`` (bytes, or
    characters of a ``str``); bytes that are not UTF-8 raise ``UnicodeDecodeError`` (a
    ValueError).

    ``max_depth=None`` skips the scan (it costs about what parsing does) and bounds the depth by
    the interpreter's recursion limit only: for JSON whose schema is checked right after and
    admits no depth (a shard header, read on every pull)."""
    if max_bytes is not None and len(data) > max_bytes:
        raise TooLargeError(f"JSON of {len(data)} bytes, over the {max_bytes}-byte limit")
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    if max_depth is not None:
        check_depth(text, max_depth)
    try:
        return json.loads(text, **options)
    except RecursionError:  # a bound the scan missed is still a bound
        raise TooDeepError(f"JSON nested deeper than {max_depth or 'the recursion limit'} "
                           "levels") from None


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Refuse ``text`` if its brackets (outside strings) nest deeper than ``max_depth``; linear
    in ``len(text)`` (at most ``max_depth`` passes over the brackets alone)."""
    if text.count("[") + text.count("{") <= max_depth:
        return  # too few brackets to nest that deep
    brackets = STRING.sub("", text).encode("utf-8", "replace").translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):  # each pass removes the innermost level
        if not brackets:
            return
        inner = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if inner == brackets:
            return  # unbalanced: the parser reports it
        brackets = inner
    if brackets:
        raise TooDeepError(f"JSON nested deeper than {max_depth} levels")


def read_capped(pieces: Iterable[bytes], limit: int) -> bytes | None:
    """The bytes of a streamed answer, read with ``limit`` applied while reading (never whole
    first); None as soon as it holds more than ``limit`` bytes, for the caller to refuse in
    its own terms."""
    body = bytearray()
    for piece in pieces:
        body += piece
        if len(body) > limit:
            return None
    return bytes(body)
