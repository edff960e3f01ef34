"""Webhooks over a catalog (the embedded registry and the server): subscriptions, the test
ping, and delivering what the outbox owes.

Built by ``LocalBackend`` with the narrow things it needs: the catalog's webhook rows, the
sealer of secrets, the sender, and the retry window. Delivery is at least once: an attempt
whose answer was lost is sent again, with the same ``X-Registry-Delivery`` id.
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from ..errors import ServerUnavailableError, SettingsError
from ..events import KINDS
from . import records
from .records import Attempt, Delivery, Recorded, Webhook
from .sealing import KEY_FILE, Sealer
from .sender import TIMEOUT_S, Sender
from .service import WebhookStore
from .signing import signed_headers
from .targets import check

if TYPE_CHECKING:
    from pathlib import Path

    from ..catalog.webhooks import Claimed, WebhookRows
    from ..settings import Settings

__all__ = ["LocalWebhooks", "WebhookStore", "webhooks_for"]

log = logging.getLogger(__name__)

# A claimed delivery is its worker's for this long: several attempts' time bounds, so a live
# worker never loses it mid-attempt, and a dead one's deliveries wait at most this long.
LEASE = timedelta(seconds=6 * TIMEOUT_S)
# Retries: 1 s, 2 s, 4 s ... doubling up to an hour, each drawn in [half, whole] (jitter, so
# receivers that come back are not hit by every registry at once).
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 3600.0
# Delivered and failed deliveries (and their attempts) are kept this long, then dropped.
KEEP_DONE = timedelta(days=30)
# Deliveries sent side by side (each to another webhook or model: a model's go in order).
SEND_CONCURRENCY = 8


def backoff(attempts: int) -> timedelta:
    """The wait before the next try after ``attempts`` failed ones."""
    ceiling = min(BACKOFF_BASE_S * 2 ** min(max(attempts - 1, 0), 30), BACKOFF_CAP_S)
    return timedelta(seconds=ceiling * random.uniform(0.5, 1.0))


def body_of(payload: dict[str, Any], webhook_id: str, delivery_id: str) -> bytes:
    """The POST body: the event as ``history`` returns it, plus the webhook and delivery."""
    return json.dumps({**payload, "webhook_id": webhook_id, "delivery_id": delivery_id},
                      sort_keys=True, separators=(",", ":")).encode("utf-8")


def webhooks_for(rows: WebhookRows, settings: Settings | None, cache_dir: Path) -> LocalWebhooks:
    """The webhooks of a catalog as ``settings`` configure them (without settings: the
    defaults, the key file beside the cache's directory, as in the default home)."""
    if settings is None:
        return LocalWebhooks(rows, Sealer(None, cache_dir.parent / KEY_FILE), Sender(),
                             retry=timedelta(hours=24), kinds=lambda: KINDS)
    return LocalWebhooks(rows, Sealer(settings.webhook_key, settings.home / KEY_FILE),
                         Sender(allow_private=settings.webhook_allow_private),
                         retry=settings.webhook_retry, kinds=lambda: KINDS)


@dataclass
class DeliverReport:
    """What one pass over the outbox did."""

    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    disabled: list[str] = field(default_factory=list)

    @property
    def attempted(self) -> int:
        return self.delivered + self.retrying + self.failed


class LocalWebhooks:
    """The webhooks of one catalog."""

    def __init__(self, rows: WebhookRows, sealer: Sealer, sender: Sender, *,
                 retry: timedelta, kinds: Callable[[], Iterable[str]] = tuple) -> None:
        self.rows = rows
        self.sealer = sealer
        self.sender = sender
        self.retry = retry
        # The kinds of the event log a subscription may name (empty: any well-formed kind).
        self.kinds = kinds

    # -- subscriptions --------------------------------------------------------------------

    def add(self, url: str, events: str | Iterable[str], *,
            models: str | Iterable[str] | None = None, secret: str | None = None) -> Webhook:
        """Subscribe ``url``; the returned Webhook carries the secret (generated when absent),
        which is never shown again."""
        url = records.check_url(url)
        kinds = records.check_events(events, self.kinds())
        patterns = records.check_models(models)
        check(url, allow_private=self.sender.allow_private)  # refuse a bad target now
        if secret is not None and not (isinstance(secret, str) and 16 <= len(secret) <= 256):
            raise SettingsError("a webhook secret must be 16 to 256 characters; leave it out "
                                "to have one generated")
        secret = secret or f"whsec_{secrets.token_urlsafe(32)}"
        hook = self.rows.add(url, kinds, patterns, self.sealer.seal(secret))
        return Webhook(hook.id, hook.url, hook.events, hook.models, hook.enabled,
                       hook.created_at, hook.disabled_reason, secret)

    def listed(self) -> list[Webhook]:
        return self.rows.listed()

    def remove(self, webhook_id: str) -> None:
        self.rows.remove(records.check_id(webhook_id))

    def test(self, webhook_id: str) -> int:
        """Send a ``ping`` now (recorded among the deliveries) and return the receiver's
        status; ServerUnavailableError when it did not answer."""
        hook, sealed = self.rows.get(records.check_id(webhook_id))
        delivery_id = f"dl_{uuid.uuid4().hex[:24]}"
        # Shaped as an event of the log (no id: a ping is not one), so a receiver's parser
        # takes it as it takes the others.
        payload = {"id": None, "at": datetime.now(timezone.utc).isoformat(),
                   "actor": "registry", "kind": records.PING, "name": None, "version": None,
                   "alias": None, "previous": None, "details": {"url": hook.url}}
        body = body_of(payload, hook.id, delivery_id)
        attempt = self.sender.post(hook.url, body, signed_headers(
            self.sealer.open(sealed), records.PING, delivery_id, body))
        self.rows.record_test(hook.id, records.PING, delivery_id, payload, attempt,
                              delivered=attempt.status is not None
                              and 200 <= attempt.status < 300)
        if attempt.status is None:
            raise ServerUnavailableError(f"webhook {hook.id} at {hook.url} did not answer the "
                                         f"ping: {attempt.error}")
        return attempt.status

    def deliveries(self, webhook_id: str, *, limit: int = 100) -> list[Delivery]:
        return self.rows.deliveries(records.check_id(webhook_id), limit=max(1, min(limit, 1000)))

    # -- delivery -------------------------------------------------------------------------

    def deliver(self, *, worker: str | None = None, limit: int = 32,
                pool: Executor | None = None) -> DeliverReport:
        """One pass: claim what is due (one per webhook and model) and send it, side by side
        on ``pool`` (a worker's own, kept between passes; else one made for this pass).
        Attempts are recorded as they finish, those that finished together in one
        transaction."""
        worker = worker or f"w-{uuid.uuid4().hex[:12]}"
        report = DeliverReport()
        claimed: list[Claimed] = self.rows.claim(worker, LEASE, limit=limit)
        for batch in self._sent(claimed, pool):
            self.rows.record(done for done, _ in batch)
            for done, outcome in batch:
                if done.disable is not None:
                    report.disabled.append(done.disable[0])
                    log.warning("webhook %s disabled: its receiver answered 410 Gone",
                                done.disable[0])
                setattr(report, outcome, getattr(report, outcome) + 1)
        return report

    def _sent(self, claimed: list[Claimed],
              pool: Executor | None) -> Iterator[list[tuple[Recorded, str]]]:
        """The attempts of ``claimed``, in batches as they finish. An error of the code (not of
        a receiver: those are attempts) is raised once the others are recorded; its delivery's
        lease runs out and it is tried again."""
        if len(claimed) <= 1 or SEND_CONCURRENCY <= 1:
            yield from ([self._attempt(c)] for c in claimed)
            return
        executor = pool or ThreadPoolExecutor(max_workers=min(SEND_CONCURRENCY, len(claimed)),
                                              thread_name_prefix="webhook-send")
        own = executor if pool is None else None
        running: set[Future[tuple[Recorded, str]]] = {
            executor.submit(self._attempt, c) for c in claimed}
        error: BaseException | None = None
        try:
            while running:
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                batch = []
                for future in finished:
                    if future.exception() is None:
                        batch.append(future.result())
                    else:
                        error = error or future.exception()
                yield batch
        finally:
            if own is not None:
                own.shutdown(wait=True)
        if error is not None:
            raise error

    def next_due(self) -> datetime | None:
        return self.rows.next_due()

    def prune(self) -> int:
        """Forget deliveries done more than :data:`KEEP_DONE` ago; how many."""
        return self.rows.prune(datetime.now(timezone.utc) - KEEP_DONE)

    def pending(self) -> int:
        return self.rows.pending()

    def _attempt(self, claim: Claimed) -> tuple[Recorded, str]:
        """Send ``claim`` once: what to record of it, and the outcome for the report."""
        body = body_of(claim.payload, claim.webhook_id, claim.delivery_id)
        try:
            headers = signed_headers(self.sealer.open(claim.sealed_secret), claim.kind,
                                     claim.delivery_id, body)
        except SettingsError as exc:  # this replica's key cannot open the secret
            now = datetime.now(timezone.utc)
            attempt = Attempt(now, None, 0, "", str(exc))
        else:
            attempt = self.sender.post(claim.url, body, headers)
        status, after, disable = attempt.status, None, None
        if status is not None and 200 <= status < 300:
            outcome = "delivered"
        elif status == 410:
            outcome = "failed"
            disable = (claim.webhook_id,
                       f"the receiver answered 410 Gone at {attempt.at.isoformat()}")
        else:
            after = attempt.at + backoff(claim.attempts + 1)
            outcome = "retrying"
            if after - claim.created_at > self.retry:
                outcome, after = "failed", None
                log.warning("webhook %s: delivery %s given up after %d attempts",
                            claim.webhook_id, claim.delivery_id, claim.attempts + 1)
        state = {"delivered": "delivered", "retrying": "pending"}.get(outcome, "failed")
        return Recorded(claim.pk, claim.owner, attempt, state, after, disable), outcome
