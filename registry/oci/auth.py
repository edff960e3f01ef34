"""Credentials and the distribution spec's auth dance: anonymous, Basic, and Bearer tokens.

A 401 names the scheme in ``WWW-Authenticate``. ``Basic``: the host's username and password
are sent. ``Bearer realm=...,service=...,scope=...``: a token is fetched from the realm (with
Basic credentials when the host has some, anonymously otherwise) and cached per scope, so a
push holding a ``pull`` token asks again for ``pull,push``.

Credentials come from ``REGISTRY_OCI_AUTH`` (settings.py) for the host, else from the docker
config file (``auths``: ``auth`` or ``identitytoken`` entries; credential helpers are not run).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import (
    ForbiddenError,
    OciUnavailableError,
    SettingsError,
    UnauthorizedError,
    quoted,
)
from ..http.headers import why_not_header_value
from ..settings import OciCredential, parse_oci_auth
from ..trust import boundedjson

_PARAM_RE = re.compile(r'([A-Za-z_]+)="([^"]*)"')
MAX_TOKEN_ANSWER = 1 << 20


def credential_for(host: str, configured: tuple[OciCredential, ...] | None,
                   docker_config: Path | None) -> OciCredential | None:
    """The credential for ``host``: ``REGISTRY_OCI_AUTH``'s, else the docker config's."""
    if configured is not None:
        return next((c for c in configured if c.host == host), None)
    if docker_config is None or not docker_config.is_file():
        return None
    try:
        auths = json.loads(docker_config.read_text()).get("auths", {})
    except (OSError, ValueError, AttributeError):
        return None
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        # Docker writes keys as hosts or as URLs ("https://index.docker.io/v1/").
        name = re.sub(r"^[a-z]+://", "", str(key)).split("/")[0].lower()
        if name != host or not isinstance(entry, dict):
            continue
        if isinstance(entry.get("identitytoken"), str):
            why = why_not_header_value(entry["identitytoken"])
            if why is not None:
                raise SettingsError(f"{docker_config}: the identitytoken of {host} cannot be "
                                    f"sent as a bearer token ({why}); log in again")
            return OciCredential(host, token=entry["identitytoken"])
        if "auth" in entry:
            try:
                return parse_oci_auth(json.dumps({host: {"auth": entry["auth"]}}),
                                      str(docker_config))[0]
            except Exception:
                return None
    return None


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="..."`` -> ``("bearer", {"realm": ..., ...})``."""
    scheme, _, params = header.strip().partition(" ")
    return scheme.lower(), {k.lower(): v for k, v in _PARAM_RE.findall(params)}


class Authenticator:
    """The Authorization header for each scope of one registry host, learned from 401s."""

    def __init__(self, host: str, credential: OciCredential | None,
                 get_token: Callable[[str, dict[str, str], dict[str, str]], Any]) -> None:
        self.host = host
        self.credential = credential
        self._get_token = get_token  # (realm, params, headers) -> response with .json()
        self._headers: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._fetching: dict[str, threading.Lock] = {}  # one token request at a time per scope
        self._refusals: dict[str, UnauthorizedError | ForbiddenError] = {}

    def headers(self, scope: str) -> dict[str, str]:
        with self._lock:
            known = self._headers.get(scope) or self._headers.get("*")
        if known is not None:
            return dict(known)
        if self.credential is not None and self.credential.token \
                and not self.credential.username:
            return {"Authorization": f"Bearer {self.credential.token}"}
        return {}

    def answer(self, challenge: str | None, scope: str, status: int,
               sent: str | None = None) -> dict[str, str]:
        """Headers that answer a 401 for ``scope``; UnauthorizedError when none can.

        ``sent`` is the Authorization the refused request carried. Parallel requests refused
        together fetch one token: the others wait for it and use it, unless it is the very
        token the registry just refused (then a new one is asked for); credentials the realm
        refused are not sent to it again (a service may lock an account after failed logins)."""
        scheme, params = parse_challenge(challenge or "")
        if scheme == "basic":
            if self.credential is None or not self.credential.username:
                raise self.refused(status, "it asks for a username and password")
            pair = f"{self.credential.username}:{self.credential.password}".encode()
            found = {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
            with self._lock:
                self._headers["*"] = found
            return dict(found)
        if scheme != "bearer" or "realm" not in params:
            raise self.refused(status, f"its challenge {quoted(challenge, 80)} is not one "
                                        "this client answers (Basic or Bearer with a realm)")
        with self._lock:
            fetching = self._fetching.setdefault(scope, threading.Lock())
        with fetching:
            with self._lock:
                known, refused = self._headers.get(scope), self._refusals.get(scope)
            if refused is not None:  # the realm refused these credentials: not asked again
                raise refused
            if known is not None and known.get("Authorization") != sent:
                return dict(known)
            try:
                return self._fetch(params, scope, status)
            except (UnauthorizedError, ForbiddenError) as exc:
                with self._lock:
                    self._refusals[scope] = exc
                raise

    def _fetch(self, params: dict[str, str], scope: str, status: int) -> dict[str, str]:
        query = {"service": params["service"]} if "service" in params else {}
        query["scope"] = params.get("scope") or scope
        headers: dict[str, str] = {}
        cred = self.credential
        if cred is not None and cred.username:
            pair = f"{cred.username}:{cred.password}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"
        elif cred is not None and cred.token:
            headers["Authorization"] = f"Bearer {cred.token}"
        answer = self._get_token(params["realm"], query, headers)
        if answer.status_code in (401, 403):
            raise self.refused(answer.status_code, "its token service refused the "
                                                    "credentials")
        try:
            body = boundedjson.loads(answer.content, max_bytes=MAX_TOKEN_ANSWER)
            token = body.get("token") or body.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if answer.status_code != 200 or not isinstance(token, str) or not token:
            raise OciUnavailableError(f"the token service of {self.host} answered "
                                      f"{answer.status_code} without a token")
        why = why_not_header_value(token)
        if why is not None:  # CR/LF would split a header, or make http.client raise raw
            raise OciUnavailableError(f"the token service of {self.host} answered a token that "
                                      f"cannot be sent as a header ({why}); it was not used")
        found = {"Authorization": f"Bearer {token}"}
        with self._lock:
            self._headers[scope] = found
        return dict(found)

    def refused(self, status: int, why: str) -> UnauthorizedError | ForbiddenError:
        where = "REGISTRY_OCI_AUTH or ~/.docker/config.json"
        if status == 403:
            return ForbiddenError(f"OCI registry {self.host} refused access ({why}); use "
                                  f"credentials allowed to do this ({where})")
        has = "the credentials given were refused" if self.credential else "no credentials " \
              "are configured for it"
        return UnauthorizedError(f"OCI registry {self.host} needs authentication ({why}; {has});"
                                 f" set them in {where}")
