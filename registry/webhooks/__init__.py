"""Webhooks: every event of the log POSTed, signed, at least once, to the URLs subscribed.

``records`` holds what reads return and what a subscription matches; ``signing`` the signature
(and :func:`verify`, for receivers); ``targets`` the SSRF guard; ``sender`` one bounded POST;
``sealing`` the secrets sealed outside the catalog; ``local`` and ``remote`` the webhooks of a
catalog and of a server; ``worker`` the delivery loop. The outbox's tables are the catalog's
(``registry/catalog/webhooks.py``).

A receiver needs only :func:`verify`::

    from registry.webhooks import verify
    verify(secret, request_headers, raw_body)   # raises WebhookSignatureError
"""

from ..errors import WebhookSignatureError
from .records import Attempt, Delivery, Webhook
from .signing import verify

__all__ = ["Attempt", "Delivery", "Webhook", "WebhookSignatureError", "verify"]
