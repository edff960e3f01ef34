"""Signatures over a registry server: records by ``GET``/``POST`` on
``/models/{name}/versions/{n}/signatures`` (bundles inline, base64: each is at most
``MAX_BUNDLE_BYTES``), bundles read back through the verified blob cache. Every answer is
checked before use. Built by RemoteBackend over the transport it shares, never the backend.

A push that signs sends its signature with the commit (:meth:`RemoteSignatures.commit_fields`),
so a server that requires signatures (REGISTRY_REQUIRE_SIGNED) can refuse an unsigned commit
before the version becomes visible.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..errors import NotFoundError, RegistryError, SignatureError
from ..trust.validate import answer_field
from . import records
from .oms import MAX_BUNDLE_BYTES

if TYPE_CHECKING:  # `import registry` loads this module, and must not load the HTTP stack
    from ..http.transport import Transport

SIGNATURES_ROUTE = "/models/{name}/versions/{version}/signatures"


def route(name: str, version: int) -> str:
    return SIGNATURES_ROUTE.format(name=quote(name, safe=""), version=version)


def wire(record: Mapping[str, Any], bundles: Mapping[str, bytes]) -> dict[str, Any]:
    """The JSON body that carries a signature: its record and its bundles, base64."""
    return {"record": dict(record),
            "bundles": {d: base64.b64encode(b).decode("ascii") for d, b in bundles.items()}}


def from_wire(body: Mapping[str, Any], origin: str) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(record, bundles) of a body :func:`wire` made; SignatureError when malformed."""
    record = records.check(body.get("record"), origin)
    raw = body.get("bundles")
    if not isinstance(raw, Mapping) or len(raw) > 2:
        raise SignatureError(f"{origin} carries no bundles (a map of digest -> base64)")
    bundles = {}
    for digest, text in raw.items():
        if not isinstance(text, str) or len(text) > (MAX_BUNDLE_BYTES * 4) // 3 + 4:
            raise SignatureError(f"{origin}: bundle {str(digest)[:80]!r} is not base64 of at "
                                 f"most {MAX_BUNDLE_BYTES} bytes")
        try:
            bundles[str(digest)] = base64.b64decode(text, validate=True)
        except ValueError:
            raise SignatureError(f"{origin}: bundle {str(digest)[:80]!r} is not base64") from None
    return record, bundles


class RemoteSignatures:
    """The signatures of a registry server's versions."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        # A signature a push in progress sends with its commit (set by the facade's push).
        self.commit_signer: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None

    def listed(self, name: str, version: int) -> list[dict[str, Any]]:
        """The server's records; [] from a server without signature routes (one older than
        them holds no signatures; stripping them is what REGISTRY_VERIFY=require refuses, a
        hostile server could as well answer [])."""
        try:
            answer = self.transport.call("GET", route(name, version))
        except NotFoundError:
            return []
        return answer_field(answer, "signature list", "signatures",
                            lambda v: records.check_list(v, "the server's signature list"))

    def bundle(self, digest: str, size: int) -> bytes:
        if not 0 < size <= MAX_BUNDLE_BYTES:
            raise SignatureError(f"signature bundle {digest} is listed with {size} bytes, not a "
                                 f"bundle's size (at most {MAX_BUNDLE_BYTES}); it was not used")
        with self.transport.open_blob(digest, size) as fh:  # the very file the cache verified
            return fh.read(MAX_BUNDLE_BYTES + 1)

    def add(self, name: str, version: int, record: Mapping[str, Any],
            bundles: Mapping[str, bytes]) -> dict[str, Any]:
        answer = self.transport.call("POST", route(name, version), json=wire(record, bundles))
        kept = answer_field(answer, "signature answer", "signature",
                            lambda v: records.check(v, "the server's signature answer"))
        if kept["digest"] != record["digest"]:
            raise RegistryError("the registry server answered a signature with another one; is "
                                "REGISTRY_URI a registry server of this version?")
        return kept

    def commit_fields(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """What a commit of ``manifest`` adds to its body: ``{"signature": ...}`` when this
        push signs, else nothing."""
        if self.commit_signer is None:
            return {}
        return {"signature": self.commit_signer(manifest)}
