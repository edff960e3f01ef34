"""Bearer tokens with scopes, kept as hashes in an auth file.

The auth file (``REGISTRY_AUTH_FILE``, default ``$REGISTRY_HOME/auth.json``) is JSON::

    {"tokens": [{"name": "ci", "sha256": "<hex>", "scopes": ["read", "write"],
                 "models": ["team-a-*", "shared"],
                 "created_at": "2026-11-22T01:00:00+00:00"}]}

Plain tokens are printed once by ``registry token create`` and never stored. Scopes nest:
``admin`` grants ``write`` and ``read``; ``write`` grants ``read``. The server re-reads the file
when it changes, so ``registry token revoke`` takes effect without a restart.

``models`` (optional; absent in older files) limits a token to the models whose names match one
of its fnmatch patterns. Every route decides through ONE function, :meth:`Principal.may_see`
(:meth:`Principal.check` raises the answer for a model it may not see: the very 404 of a model
that does not exist, so names do not leak). ``server/dependencies.py`` applies it to every
route with a ``{name}`` path parameter; a route that finds a model name elsewhere (a ref in the
query, a blob's owners, a door's own path such as ``/hf``) calls ``principal.check(name)`` or
filters what it lists with :meth:`Principal.visible`. An admin token with patterns is an admin
of those models only: routes over the whole registry (gc, MLflow sync, events, webhooks, token
management) need an admin token without ``models`` (:meth:`Principal.require_all_models`).

Three modes, chosen when the server starts:
- ``tokens``: an auth file exists; every request needs a token with the route's scope.
- ``open``: no auth file on a loopback host; everything is allowed (local development).
- ``read-only``: no auth file and ``--allow-anonymous``; reads are anonymous, writes refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from registry.errors import ForbiddenError, NotFoundError, SettingsError, UnauthorizedError
from registry.settings import Settings

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")
_IMPLIED: dict[str, set[str]] = {"read": {"read"}, "write": {"read", "write"},
                                 "admin": {"read", "write", "admin"}}
_TOKEN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
TOKEN_PREFIX = "reg_"
Mode = Literal["tokens", "open", "read-only"]
# Model patterns: fnmatch only (``*``, ``?``, ``[seq]``, ``[!seq]``) over the characters of a
# model name, bounded in length and number; never a regular expression from the user.
_PATTERN_RE = re.compile(r"[a-z0-9._*?\[\]!-]{1,128}")
MAX_PATTERNS = 32


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


def parse_model_patterns(text: str | Iterable[object]) -> tuple[str, ...]:
    """``"team-a-*,shared"`` (or a list read from the auth file) -> ``("team-a-*", "shared")``.

    fnmatch patterns over model names (lowercase letters, digits, ``.``, ``_``, ``-``) with
    ``*``, ``?`` and ``[...]``; at most :data:`MAX_PATTERNS` of at most 128 characters. A bad
    pattern is a SettingsError naming it."""
    raw = text.split(",") if isinstance(text, str) else list(text)
    if len(raw) > MAX_PATTERNS:
        raise SettingsError(f"{len(raw)} model patterns given; a token takes at most "
                            f"{MAX_PATTERNS} (use wildcards such as 'team-a-*')")
    items: list[str] = []
    for item in raw:
        pattern = item.strip() if isinstance(item, str) else item
        if pattern == "" and isinstance(text, str):
            continue
        if not isinstance(pattern, str) or not _PATTERN_RE.fullmatch(pattern):
            raise SettingsError(
                f"invalid model pattern {str(pattern)[:140]!r}: use 1-128 characters of "
                "lowercase letters, digits, '.', '_', '-' and the wildcards *, ? and [...] "
                "(e.g. 'team-a-*'); separate patterns with commas")
        if pattern not in items:
            items.append(pattern)
    if not items:
        raise SettingsError("no model patterns given; pass --models 'team-a-*,shared', or "
                            "leave --models out for a token over all models")
    return tuple(items)


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a plain sha256 is as good as a slow KDF here.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenEntry:
    name: str
    sha256: str
    scopes: tuple[str, ...]
    created_at: str
    # fnmatch patterns of the models this token may see; None: every model.
    models: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Principal:
    """Who is calling and what they may touch: a route's ``read``/``write``/``admin``
    dependency answers one (``str()`` of it is the caller's name, for logs).

    The one check every route uses: :meth:`may_see` decides whether a model name is visible to
    this caller; :meth:`check` raises the 404 a missing model gets for one that is not;
    :meth:`visible` filters a list of names."""

    name: str
    scopes: frozenset[str] = frozenset(SCOPES)
    models: tuple[str, ...] | None = None  # None: every model

    def __str__(self) -> str:
        return self.name

    @property
    def restricted(self) -> bool:
        """Whether this caller sees only the models its patterns match."""
        return self.models is not None

    def may_see(self, name: str) -> bool:
        """THE model check: whether model ``name`` exists for this caller at all (case-sensitive
        fnmatch against the token's patterns; every model for a token without them)."""
        if self.models is None:
            return True
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.models)

    def check(self, name: str) -> str:
        """``name`` if this caller may see it, else the NotFoundError a model that does not
        exist answers to this caller (:func:`missing_model`)."""
        if not self.may_see(name):
            raise missing_model(self, name)
        return name

    def visible(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` this caller may see, in their order."""
        return [n for n in names if self.may_see(n)]

    def require_all_models(self, what: str) -> None:
        """ForbiddenError unless this caller's token covers every model: ``what`` (gc, events,
        webhooks, token management) acts on the whole registry."""
        if self.models is not None:
            raise ForbiddenError(
                f"token {self.name!r} is limited to models {','.join(self.models)}; {what} acts "
                "on the whole registry and needs an admin token created without --models")


def missing_model(principal: Principal, name: str) -> NotFoundError:
    """The answer to a restricted caller naming a model that does not exist for it, whether it
    exists for others or not: one message, so the two cannot be told apart."""
    return NotFoundError(f"model {name!r} not found; this token sees models matching "
                         f"{','.join(principal.models or ('*',))}")


def visible_models(principal: Principal, page: Callable[[int, str | None], list[str]], *,
                   limit: int, after: str | None) -> list[str]:
    """Up to ``limit`` names this caller may see, sorted, after ``after``: read from ``page``
    (``page(n, after)`` -> the next n names of all models) in batches, filtered."""
    if not principal.restricted:
        return page(limit, after)
    found: list[str] = []
    cursor = after
    batch = max(limit, _LIST_BATCH)
    while len(found) < limit:
        names = page(batch, cursor)
        found.extend(principal.visible(names))
        if len(names) < batch:
            break
        cursor = names[-1]
    return found[:limit]


_LIST_BATCH = 1000


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

    def create(self, name: str, scopes: list[Scope],
               models: tuple[str, ...] | None = None) -> str:
        """Append a new token named ``name``; return the plain token (shown once). ``models``
        (from :func:`parse_model_patterns`) limits it to the models they match."""
        if not _TOKEN_NAME_RE.fullmatch(name):
            raise SettingsError(f"invalid token name {name!r}: use 1-64 lowercase letters, "
                                "digits, '.', '_' or '-' (e.g. 'ci')")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._editing() as entries:
            if any(e.name == name for e in entries):
                raise SettingsError(f"token {name!r} already exists in {self.path}; revoke it "
                                    f"first (`registry token revoke {name}`) or pick another name")
            if models is not None:
                models = parse_model_patterns(models)
            entries.append(TokenEntry(name, hash_token(token), tuple(scopes),
                                      datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                      models))
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
            data = {"tokens": [_entry_json(e) for e in entries]}
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


def _entry_json(e: TokenEntry) -> dict[str, object]:
    data: dict[str, object] = {"name": e.name, "sha256": e.sha256, "scopes": list(e.scopes)}
    if e.models is not None:  # absent means every model, as in files written before patterns
        data["models"] = list(e.models)
    data["created_at"] = e.created_at
    return data


def _read_entries(path: Path) -> list[TokenEntry]:
    try:
        data = json.loads(path.read_text())
        entries = []
        for t in data["tokens"]:
            models = t.get("models")
            if models is not None:
                if not isinstance(models, list):
                    raise TypeError(f"token {str(t['name'])[:64]!r}: models is not a list")
                try:
                    models = parse_model_patterns(models)
                except SettingsError as exc:
                    raise ValueError(f"token {str(t['name'])[:64]!r}: {exc}") from None
            entries.append(TokenEntry(str(t["name"]), str(t["sha256"]), tuple(t["scopes"]),
                                      str(t.get("created_at", "")), models))
        return entries
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

    def authorize(self, authorization: str | None, scope: Scope) -> Principal:
        """The caller if ``authorization`` grants ``scope``; raise 401/403 errors."""
        if self.mode == "open":
            return Principal("anonymous")
        if self.mode == "read-only":
            if scope == "read":
                return Principal("anonymous", frozenset({"read"}))
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
        return Principal(entry.name, frozenset(granted), entry.models)


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


__all__ = ["SCOPES", "AuthFile", "AuthPolicy", "Principal", "TokenEntry", "default_auth_file",
           "is_loopback", "missing_model", "parse_model_patterns", "parse_scopes",
           "visible_models"]
