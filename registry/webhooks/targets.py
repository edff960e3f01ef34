"""Where a webhook may POST: the SSRF guard.

A webhook URL is chosen by whoever holds an admin token, and the registry calls it from inside
its network, so by default it refuses what only an insider can reach: a scheme other than http
and https, and a host that resolves to a loopback, link-local, private, shared (CGNAT),
multicast or otherwise non-global address. ``REGISTRY_WEBHOOK_ALLOW_PRIVATE=1`` allows those
(a receiver on the same network), but never the cloud metadata services, which hand out
credentials.

The check is on the *resolved* addresses, and the sender connects to the very address that was
checked (:class:`Target`), so a name that resolves to a public address when checked and a
private one a moment later (DNS rebinding) cannot slip through.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import WebhookTargetError, quoted

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Instance metadata services (AWS, GCP, Azure, OpenStack; AWS over IPv6; ECS task credentials;
# Alibaba): refused even where private addresses are allowed.
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "169.254.170.23", "100.100.100.200"))
_ALLOW_HINT = ("set REGISTRY_WEBHOOK_ALLOW_PRIVATE=1 on the registry to allow receivers on "
               "private networks")


@dataclass(frozen=True)
class Target:
    """A checked URL: what to connect to (``address``, one of the host's resolved addresses
    that passed), and what to ask for there (``host`` for the Host header and TLS)."""

    scheme: str
    host: str
    port: int
    path: str
    address: str


def refusal(address: IpAddress, *, allow_private: bool) -> str | None:
    """Why ``address`` may not be called (None: it may)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour \
            or (address.teredo[1] if address.teredo else None)
        if embedded is not None:
            return refusal(embedded, allow_private=allow_private)
    if address in METADATA:
        return "a cloud metadata service"
    if address.is_unspecified or address.is_multicast:
        return "not a host address"
    if allow_private:
        return None
    for what, test in (("loopback", address.is_loopback), ("link-local", address.is_link_local),
                       ("private", address.is_private), ("reserved", address.is_reserved)):
        if test:
            return f"a {what} address"
    if not address.is_global:
        return "not a public address"
    return None


def check(url: str, *, allow_private: bool) -> Target:
    """Resolve ``url``'s host and check every address it has; :class:`WebhookTargetError`
    names the URL and the address refused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookTargetError(f"webhook URL {quoted(url)} is not http or https; give a URL "
                                 "such as 'https://deploy.example/hooks/registry'")
    if parts.username or parts.password:
        raise WebhookTargetError(f"webhook URL {quoted(_bare(url))} carries credentials; the "
                                 "delivery's signature authenticates it, drop them")
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookTargetError(f"webhook URL {quoted(url)} has a bad port") from None
    if not host:
        raise WebhookTargetError(f"webhook URL {quoted(url)} names no host")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise WebhookTargetError(f"webhook host {host!r} does not resolve ({exc}); check the "
                                 "URL") from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0])
                                   for info in found))
    for address in addresses:
        why = refusal(address, allow_private=allow_private)
        if why is not None:
            hint = "" if why == "a cloud metadata service" or allow_private \
                else f"; {_ALLOW_HINT}"
            raise WebhookTargetError(f"webhook URL {quoted(_bare(url))} resolves to {address}, "
                                     f"{why}; the registry does not call it{hint}")
    if not addresses:
        raise WebhookTargetError(f"webhook host {host!r} has no address")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(parts.scheme, host, port, path, str(addresses[0]))


def _bare(url: str) -> str:
    """``url`` without credentials or query (neither belongs in a message)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{netloc}{parts.path}"
