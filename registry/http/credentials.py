"""Credentials read from the environment: an OCI registry's (``REGISTRY_OCI_AUTH`` or a docker
config's ``auths``) and bearer tokens (``REGISTRY_TOKEN``), checked when they are read so a
message names the variable at fault (never the secret), and a token that could not be sent as a
header value (CR, LF, other control characters) is refused here rather than inside a request."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import SettingsError
from .headers import why_not_header_value


@dataclass(frozen=True)
class OciCredential:
    """Credentials for one OCI registry host (``REGISTRY_OCI_AUTH``); secrets never print."""

    host: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)


_OCI_HOST_RE = re.compile(r"[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


def parse_oci_auth(raw: str, variable: str) -> tuple[OciCredential, ...]:
    """``REGISTRY_OCI_AUTH`` (or a docker config's ``auths``) -> credentials by host.

    Entries are ``{"username", "password"}``, ``{"auth": base64("user:password")}`` or
    ``{"token"}``; a message names the host at fault, never a secret.
    """
    import base64
    import binascii
    import json

    try:
        table = json.loads(raw)
    except ValueError:
        raise SettingsError(f"{variable} is not JSON; use e.g. "
                            '\'{"ghcr.io": {"username": "me", "password": "..."}}\'') from None
    if not isinstance(table, dict):
        raise SettingsError(f"{variable} must be a JSON object keyed by registry HOST[:PORT]")
    out = []
    for host, entry in table.items():
        if not isinstance(host, str) or not _OCI_HOST_RE.fullmatch(host):
            raise SettingsError(f"{variable} has key {str(host)[:80]!r}, which is not a registry "
                                "HOST[:PORT] such as 'ghcr.io' or '127.0.0.1:5000'")
        if not isinstance(entry, dict) or not entry:
            raise SettingsError(f"{variable}[{host!r}] must be an object such as "
                                '{"username": "...", "password": "..."}')
        user, password, token = entry.get("username"), entry.get("password"), entry.get("token")
        if "auth" in entry:
            try:
                user, sep, password = base64.b64decode(str(entry["auth"]),
                                                       validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                sep = ""
            if not sep:
                raise SettingsError(f"{variable}[{host!r}].auth is not base64 of "
                                    "'username:password'")
        if not all(v is None or isinstance(v, str) for v in (user, password, token)) \
                or (token is None and (not user or password is None)):
            raise SettingsError(f"{variable}[{host!r}] needs string 'username' and 'password', "
                                "'auth' (base64 of 'username:password') or 'token'")
        if token is not None:
            bearer_token(token, f"{variable}[{host!r}].token")
        out.append(OciCredential(host.lower(), user, password, token))
    return tuple(out)


def bearer_token(raw: str | None, variable: str) -> str | None:
    """A token sent as a header value: CR, LF or another control character refused here, by
    name, rather than by httpx deep inside a request (the value is never echoed)."""
    why = None if raw is None else why_not_header_value(raw)
    if why is not None:
        raise SettingsError(f"{variable} cannot be sent as a bearer token: {why}; set it to the "
                            "token alone")
    return raw
