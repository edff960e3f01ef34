"""A loop on a thread of its own that sleeps until it is poked, stopped or its pause ends: the
shape the MLflow mirror's worker and the webhook delivery worker share."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """The thread, its wake-up and its stop. ``target`` runs the loop; it calls :meth:`sleep`
    between passes and returns once :attr:`stopped`. :meth:`stop` wakes it and waits up to
    ``join_s`` for it to end."""

    def __init__(self, name: str, target: Callable[[], None], *, join_s: float) -> None:
        self.name, self.target, self.join_s = name, target, join_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.target, name=self.name, daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Run the next pass now."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_s)

    def sleep(self, timeout: float | None) -> None:
        """Until poked, stopped, or ``timeout`` seconds (``None``: no end); the poke is used up."""
        self._wake.wait(timeout=timeout)
        self._wake.clear()
