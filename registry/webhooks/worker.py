"""The delivery worker: a loop over the outbox, on a background thread of ``registry serve``
(never on a request's path) or in the foreground of ``registry webhook deliver --follow``.

Every replica of a server runs one; the outbox's leases (catalog/webhooks.py) make each
delivery attempted by one replica at a time. Changes made through another replica are seen by
polling, every :data:`POLL_S` seconds while the outbox is idle.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ..io.background import Background
from .local import SEND_CONCURRENCY, DeliverReport, LocalWebhooks

log = logging.getLogger(__name__)

POLL_S = 1.0
# How often the loop forgets deliveries done long ago (local.KEEP_DONE).
PRUNE_EVERY_S = 3600.0
# After a failure of the catalog itself, the loop waits this long before looking again.
ERROR_PAUSE_S = 5.0


def deliver_due(webhooks: LocalWebhooks, *, worker: str | None = None) -> DeliverReport:
    """Deliver everything due now (passes until one finds nothing to claim); retries due
    later stay queued."""
    total = DeliverReport()
    with _senders() as pool:
        while True:
            report = webhooks.deliver(worker=worker, pool=pool)
            if not report.attempted:
                return total
            total.delivered += report.delivered
            total.retrying += report.retrying
            total.failed += report.failed
            total.disabled += report.disabled


def _senders() -> ThreadPoolExecutor:
    """The threads a worker sends on, kept from one pass to the next (starting them anew for
    every pass cost more than the POSTs to a near receiver)."""
    return ThreadPoolExecutor(max_workers=SEND_CONCURRENCY, thread_name_prefix="webhook-send")


class DeliveryWorker:
    """Delivers what the outbox owes until stopped; it never raises out of its loop."""

    def __init__(self, webhooks: LocalWebhooks, *, poll_s: float = POLL_S) -> None:
        self.webhooks = webhooks
        self.poll_s = poll_s
        self.worker = f"w-{uuid.uuid4().hex[:12]}"
        self._background = Background("webhook-delivery", self.run, join_s=15)
        self.last_error: str | None = None

    def start(self) -> None:
        self._background.start()

    def poke(self) -> None:
        """Look at the outbox now (a change was just committed)."""
        self._background.poke()

    def stop(self) -> None:
        self._background.stop()

    def run(self) -> None:
        with _senders() as pool:
            self._loop(pool)

    def _loop(self, pool: ThreadPoolExecutor) -> None:
        pruned_at = 0.0
        while not self._background.stopped:
            pause = self.poll_s
            try:
                if time.monotonic() - pruned_at > PRUNE_EVERY_S:
                    self.webhooks.prune()
                    pruned_at = time.monotonic()
                if self.webhooks.deliver(worker=self.worker, pool=pool).attempted:
                    pause = 0.0
                self.last_error = None
            except Exception as exc:  # the catalog is down: the outbox waits, nothing is lost
                if str(exc) != self.last_error:
                    log.warning("webhook delivery: %s", exc)
                self.last_error = str(exc)
                pause = ERROR_PAUSE_S
            if pause:
                self._background.sleep(pause)
