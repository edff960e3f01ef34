"""The signature of a webhook delivery, made by the registry and checked by a receiver.

    X-Registry-Timestamp: <unix seconds>
    X-Registry-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>

The timestamp is signed with the body, so a captured delivery replayed later fails
:func:`verify`'s tolerance, and one replayed at once carries the same ``X-Registry-Delivery``
(receivers that must act once dedupe on it: delivery is at least once).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any

from ..errors import WebhookSignatureError

EVENT_HEADER = "X-Registry-Event"
DELIVERY_HEADER = "X-Registry-Delivery"
TIMESTAMP_HEADER = "X-Registry-Timestamp"
SIGNATURE_HEADER = "X-Registry-Signature"
PREFIX = "sha256="
DEFAULT_TOLERANCE = 300


def signature(secret: str, timestamp: int | str, body: bytes) -> str:
    """``sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>``."""
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode("ascii") + body,
                   hashlib.sha256)
    return PREFIX + mac.hexdigest()


def signed_headers(secret: str, kind: str, delivery_id: str, body: bytes, *,
                   now: float | None = None) -> dict[str, str]:
    """The headers of one POST of a delivery (signed at the moment it is sent)."""
    timestamp = int(time.time() if now is None else now)
    return {"Content-Type": "application/json", EVENT_HEADER: kind,
            DELIVERY_HEADER: delivery_id, TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify(secret: str, headers: Mapping[str, Any], body: bytes | str, *,
           tolerance: float = DEFAULT_TOLERANCE) -> None:
    """Check a delivery a receiver got: its signature over the raw ``body`` with ``secret``,
    and a timestamp within ``tolerance`` seconds of now. ``headers`` is any mapping (a dict,
    ``http.server``'s message, a framework's headers); names match whatever their case.

    Raises :class:`~registry.errors.WebhookSignatureError`; returns None when it verifies."""
    raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    stamp = _header(headers, TIMESTAMP_HEADER)
    sent = _header(headers, SIGNATURE_HEADER)
    if stamp is None or sent is None:
        missing = TIMESTAMP_HEADER if stamp is None else SIGNATURE_HEADER
        raise WebhookSignatureError(f"the delivery has no {missing} header; it did not come "
                                    "from a registry webhook")
    if not stamp.isdigit() or len(stamp) > 12:
        raise WebhookSignatureError(f"{TIMESTAMP_HEADER} {stamp[:40]!r} is not unix seconds")
    skew = abs(time.time() - int(stamp))
    if skew > tolerance:
        raise WebhookSignatureError(
            f"{TIMESTAMP_HEADER} {stamp} is {skew:.0f}s from now, past the tolerance of "
            f"{tolerance:g}s: a replayed delivery (or a clock off; check NTP on both sides)")
    expected = signature(secret, stamp, raw)
    if not hmac.compare_digest(expected.encode("ascii"), sent.strip().encode("utf-8")):
        raise WebhookSignatureError(
            f"{SIGNATURE_HEADER} does not match the body: the secret differs from the one "
            "`registry webhook add` printed, or the body was changed (verify the raw bytes, "
            "before any JSON parsing)")


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        lowered = name.lower()
        value = next((v for k, v in headers.items()
                      if isinstance(k, str) and k.lower() == lowered), None)
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value if isinstance(value, str) else None
