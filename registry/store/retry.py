"""Trying a store operation again while its endpoint does not answer.

botocore's own retries of one call (the first try and three more) give up within about 0.3 s
of an endpoint that refuses connections, so each S3 operation is tried again as a whole, with
jittered exponential backoff, over a window (``REGISTRY_STORE_RETRY_SECONDS``, default 5 s):
a blip of a second or two is invisible to callers, a dead endpoint fails within the window.
Only "cannot reach" and "try again later" are retried; a refusal (credentials, a missing
bucket or key) fails at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from ..errors import StoreUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_RETRY_SECONDS = 5.0
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.1, 1.0
# S3 error codes that say "try again later", not "no".
TRANSIENT_CODES = frozenset({"500", "502", "503", "504", "InternalError", "ServiceUnavailable",
                             "SlowDown", "RequestTimeout", "Throttling", "ThrottlingException"})


class Unreachable(StoreUnavailableError):
    """The endpoint did not answer, or answered "try again later": worth another try. It
    leaves this module as a plain :class:`StoreUnavailableError`."""


class Backoff:
    """The pauses of one operation's tries, within ``seconds`` from its first."""

    def __init__(self, seconds: float, what: str) -> None:
        self.deadline = time.monotonic() + seconds
        self.pause = FIRST_PAUSE_S
        self.what = what

    def wait_or_raise(self, error: Unreachable) -> None:
        """Sleep before the next try; raise ``error`` as a StoreUnavailableError when the
        window has no room for one."""
        wait = self.pause * random.uniform(0.5, 1.0)
        if time.monotonic() + wait > self.deadline:
            raise StoreUnavailableError(str(error)) from None
        log.info("%s did not answer; trying again in %.2fs", self.what, wait)
        time.sleep(wait)
        self.pause = min(self.pause * 2, LONGEST_PAUSE_S)


def retried(attempt: Callable[[], T], seconds: float, what: str) -> T:
    """``attempt()``, tried again while it raises :class:`Unreachable`, for ``seconds``."""
    backoff = Backoff(seconds, what)
    while True:
        try:
            return attempt()
        except Unreachable as exc:
            backoff.wait_or_raise(exc)
