"""Bearer tokens with scopes, kept as hashes in an auth file.

The auth file (``REGISTRY_AUTH_FILE``, default ``$REGISTRY_HOME/auth.json``) is JSON::

    {"tokens": [{"name": "ci", "sha256": "<hex>", "scopes": ["read", "write"],
                 "created_at": "2026-11-22T01:00:00+00:00"}]}

Plain tokens are printed once by ``registry token create`` and never stored. Scopes nest:
``admin`` grants ``write`` and ``read``; ``write`` grants ``read``. The server re-reads the file
when it changes, so ``registry token revoke`` takes effect without a restart.

Three modes, chosen when the server starts:
- ``tokens``: an auth file exists; every request needs a token with the route's scope.
- ``open``: no auth file on a loopback host; everything is allowed (local development).
- ``read-only``: no auth file and ``--allow-anonymous``; reads are anonymous, writes refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from registry.errors import ForbiddenError, SettingsError, UnauthorizedError
from registry.settings import Settings

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")
_IMPLIED: dict[str, set[str]] = {"read": {"read"}, "write": {"read", "write"},
                                 "admin": {"read", "write", "admin"}}
_TOKEN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
TOKEN_PREFIX = "reg_"
Mode = Literal["tokens", "open", "read-only"]


def default_auth_file(environ: dict[str, str] | None = None) -> Path:
    """``REGISTRY_AUTH_FILE``, else ``$REGISTRY_HOME/auth.json`` (see ``Settings.auth_path``)."""
    return Settings.from_env(environ).auth_path


def parse_scopes(text: str) -> list[Scope]:
    """``"read,write"`` -> ``["read", "write"]``; unknown scopes raise SettingsError."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise SettingsError("no scopes given; use --scopes read, read,write or admin")
    for item in items:
        if item not in SCOPES:
            raise SettingsError(f"unknown scope {item!r}; scopes are read, write and admin")
    return [s for s in SCOPES if s in items]


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a plain sha256 is as good as a slow KDF here.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenEntry:
    name: str
    sha256: str
    scopes: tuple[str, ...]
    created_at: str


class AuthFile:
    """The token file: read (re-read when it changes), append, revoke. Writes are atomic."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[TokenEntry] = []

    def entries(self) -> list[TokenEntry]:
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                raise SettingsError(
                    f"auth file {self.path} is missing; create a token with "
                    "`registry token create NAME --scopes read`"
                ) from None
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                self._entries = _read_entries(self.path)
                self._stamp = stamp
            return list(self._entries)

    def check(self, token: str) -> TokenEntry | None:
        """The entry whose hash matches ``token``, compared in constant time."""
        digest = hash_token(token)
        found = None
        for entry in self.entries():
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        return found

    def create(self, name: str, scopes: list[Scope]) -> str:
        """Append a new token named ``name``; return the plain token (shown once)."""
        if not _TOKEN_NAME_RE.fullmatch(name):
            raise SettingsError(f"invalid token name {name!r}: use 1-64 lowercase letters, "
                                "digits, '.', '_' or '-' (e.g. 'ci')")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._editing() as entries:
            if any(e.name == name for e in entries):
                raise SettingsError(f"token {name!r} already exists in {self.path}; revoke it "
                                    f"first (`registry token revoke {name}`) or pick another name")
            entries.append(TokenEntry(name, hash_token(token), tuple(scopes),
                                      datetime.now(timezone.utc).isoformat(timespec="seconds")))
        return token

    def revoke(self, name: str) -> None:
        with self._editing() as entries:
            kept = [e for e in entries if e.name != name]
            if len(kept) == len(entries):
                known = ", ".join(e.name for e in entries) or "none"
                raise SettingsError(f"no token named {name!r} in {self.path} (tokens: {known})")
            entries[:] = kept

    @contextlib.contextmanager
    def _editing(self) -> Iterator[list[TokenEntry]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = _read_entries(self.path) if self.path.exists() else []
            yield entries
            data = {"tokens": [{"name": e.name, "sha256": e.sha256, "scopes": list(e.scopes),
                                "created_at": e.created_at} for e in entries]}
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".auth-")
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(data, fh, indent=1)
                    fh.write("\n")
                os.chmod(tmp, 0o600)
                os.replace(tmp, self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


def _read_entries(path: Path) -> list[TokenEntry]:
    try:
        data = json.loads(path.read_text())
        return [TokenEntry(str(t["name"]), str(t["sha256"]), tuple(t["scopes"]),
                           str(t.get("created_at", ""))) for t in data["tokens"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"auth file {path} is not a registry token file ({exc}); fix it or "
                            "recreate it with `registry token create`") from None


@dataclass(frozen=True)
class AuthPolicy:
    """How a server decides who may do what."""

    mode: Mode
    file: AuthFile | None = None

    @classmethod
    def for_server(cls, host: str, *, auth_file: Path | None,
                   allow_anonymous: bool) -> AuthPolicy:
        """The policy for a server on ``host``; refuses an open server on a public address."""
        if auth_file is not None and auth_file.exists():
            policy = cls("tokens", AuthFile(auth_file))
            policy.file.entries()  # type: ignore[union-attr]  # a broken file fails at start
            return policy
        if allow_anonymous:
            return cls("read-only")
        if is_loopback(host):
            return cls("open")
        where = f" ({auth_file} does not exist)" if auth_file is not None else ""
        raise SettingsError(
            f"refusing to serve on non-loopback host {host!r} without an auth file{where}: "
            "create one with `registry token create NAME --scopes admin` (or set "
            "REGISTRY_AUTH_FILE), or pass --allow-anonymous for anonymous read-only access"
        )

    def authorize(self, authorization: str | None, scope: Scope) -> str:
        """The caller's name if ``authorization`` grants ``scope``; raise 401/403 errors."""
        if self.mode == "open":
            return "anonymous"
        if self.mode == "read-only":
            if scope == "read":
                return "anonymous"
            raise ForbiddenError(f"this server allows anonymous reads only; {scope} needs a "
                                 "server started with an auth file (REGISTRY_AUTH_FILE)")
        assert self.file is not None
        token = _bearer(authorization)
        if token is None:
            raise UnauthorizedError("missing bearer token; pass token=... or set REGISTRY_TOKEN")
        entry = self.file.check(token)
        if entry is None:
            raise UnauthorizedError("invalid or revoked token; create a new one with "
                                    "`registry token create`")
        granted = set().union(*(_IMPLIED.get(s, set()) for s in entry.scopes))
        if scope not in granted:
            raise ForbiddenError(f"token {entry.name!r} has scopes {','.join(entry.scopes)}; "
                                 f"this request needs {scope}")
        return entry.name


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


__all__ = ["SCOPES", "AuthFile", "AuthPolicy", "default_auth_file", "is_loopback",
           "parse_scopes"]
