"""Idempotency keys of pushes: one key names one push, so a push retried after an unknown
outcome (its answer lost after the catalog commit) gets that push's version, never a second.

A client makes a key per ``push()`` call (or takes the caller's ``idempotency_key``) and sends
it with every request of that push and of each retry of it: the ``Idempotency-Key`` header of
the begin and the commit (a header, so servers and clients that know nothing of keys keep
working). The catalog records the key with the version it reserved
(:mod:`registry.catalog.pushes`); a begin with a key the model already holds answers that
push's version (the reservation in progress, or the committed version), and the same key with
other files is :class:`~registry.errors.PushKeyConflictError`.
"""

from __future__ import annotations

import re
import secrets

from .errors import RefError, quoted

HEADER = "Idempotency-Key"
MAX_LENGTH = 64  # the catalog column
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")


def new_key() -> str:
    """A fresh key for one push (128 random bits)."""
    return secrets.token_hex(16)


def check_key(key: object) -> str:
    """``key`` if it is a usable idempotency key, else :class:`RefError` naming it."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise RefError(f"invalid idempotency key {quoted(key)}: use 1 to {MAX_LENGTH} letters, "
                       "digits and '.', '_', ':', '-', starting with a letter or digit (a "
                       "fresh one per push, e.g. a UUID)")
    return key
