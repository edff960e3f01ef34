"""A token server for the distribution registry's ``auth: token:`` mode, written for the tests.

It plays the part of Docker's token service (the distribution spec's token dance): the
registry answers 401 with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``, the
client GETs the realm with ``service`` and ``scope`` (Basic credentials when it has some), and
the realm answers ``{"token": ...}``, a JWT the registry verifies itself.

What distribution 2.8 checks (``registry/auth/token/token.go``): ``iss`` is the configured
issuer, ``aud`` the configured service, ``exp``/``nbf`` (60 s leeway), and the signature by a key
it trusts; the key is found from the header's ``x5c`` chain, verified up to a certificate of
``rootcertbundle``. The ``access`` claim lists, per repository, the actions granted; a request
needing an action the token lacks is answered 401 again. Tokens here are ES256 (``r || s``, as
JWS wants) signed by a leaf certificate issued by a throwaway CA, the registry's root bundle.

The server grants every requested action to the one user it knows (checked by Basic auth),
refuses a wrong password with 401, and gives an anonymous caller a token with no access (as
public token services do). It records every request and counts the tokens it issued.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE = "test-registry"
ISSUER = "test-token-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Signer:
    """A CA (the registry's ``rootcertbundle``) and the leaf key and certificate that sign."""

    key: Any  # ec.EllipticCurvePrivateKey
    leaf_der: bytes
    bundle: Path

    @classmethod
    def create(cls, workdir: Path) -> Signer:
        from cryptography.hazmat.primitives import serialization

        from tests.keys import ca_and_leaf

        ca, leaf, key = ca_and_leaf("token test CA", ISSUER)
        workdir.mkdir(parents=True, exist_ok=True)
        bundle = workdir / "token-ca.pem"
        bundle.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        return cls(key, leaf.public_bytes(serialization.Encoding.DER), bundle)

    def token(self, subject: str, access: list[dict[str, Any]]) -> str:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256",
                  "x5c": [base64.b64encode(self.leaf_der).decode()]}
        claims = {"iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + 300,
                  "nbf": now - 1, "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                                 for part in (header, claims))
        der = self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))
        r, s = decode_dss_signature(der)
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def parse_scopes(values: list[str]) -> list[dict[str, Any]]:
    """``repository:team/lm:pull,push`` (several per value, space-separated, or several values)
    -> the ``access`` claim's entries."""
    access: list[dict[str, Any]] = []
    for value in values:
        for scope in value.split():
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
    return access


@dataclass
class TokenServer:
    """The realm: ``GET /token?service=...&scope=...``; see the module docstring."""

    signer: Signer
    users: dict[str, str]
    address: str = "127.0.0.1"
    requests: list[dict[str, Any]] = field(default_factory=list)
    issued: list[dict[str, Any]] = field(default_factory=list)  # (subject, access) per token
    _server: http.server.ThreadingHTTPServer | None = None

    @property
    def realm(self) -> str:
        assert self._server is not None
        return f"http://{self.address}:{self._server.server_address[1]}/token"

    def registry_auth(self) -> dict[str, str]:
        """The registry's ``auth: token:`` settings pointing here."""
        return {"realm": self.realm, "service": SERVICE, "issuer": ISSUER,
                "rootcertbundle": str(self.signer.bundle)}

    def start(self) -> TokenServer:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                owner._answer(self)

        self._server = http.server.ThreadingHTTPServer((self.address, 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(handler.path)
        query = urllib.parse.parse_qs(url.query)
        user = self._user(handler.headers.get("authorization"))
        self.requests.append({"path": url.path, "query": query, "user": user,
                              "authorization": handler.headers.get("authorization")})
        if url.path != "/token" or query.get("service") != [SERVICE]:
            self._send(handler, 400, {"errors": [{"code": "UNSUPPORTED"}]})
            return
        if user is False:
            self._send(handler, 401, {"errors": [{"code": "UNAUTHORIZED"}]},
                       {"www-authenticate": 'Basic realm="token"'})
            return
        subject = user or ""
        access = parse_scopes(query.get("scope", [])) if user else []  # anonymous: nothing
        token = self.signer.token(subject, access)
        self.issued.append({"subject": subject, "access": access})
        self._send(handler, 200, {"token": token, "access_token": token, "expires_in": 300,
                                  "issued_at": datetime.datetime.now(
                                      datetime.timezone.utc).isoformat()})

    def _user(self, authorization: str | None) -> str | bool | None:
        """The user the Basic credentials name, False when they are wrong, None when absent."""
        if not authorization:
            return None
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            name, _, password = base64.b64decode(value).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return name if name in self.users and self.users[name] == password else False

    @staticmethod
    def _send(handler: http.server.BaseHTTPRequestHandler, status: int, body: dict[str, Any],
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)
