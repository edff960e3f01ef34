"""The server's signing policy, used by the commit route and the signature routes
(``server/routes/signatures.py``).

A signature travels as ``{"record": {...}, "bundles": {digest: base64}}``, posted to a version's
signatures or sent as a push commit's ``signature``. With REGISTRY_REQUIRE_SIGNED the server
demands that signature on every commit and checks it with its own REGISTRY_TRUSTED_KEYS /
REGISTRY_TRUSTED_CERTS against exactly the files and manifest being committed, before the
version becomes visible: a write token alone cannot publish an unsigned version. Bundles are
bounded, checked against their digests and never executed; every failure is a typed 4xx.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from registry.backends import LocalBackend
from registry.errors import SignatureError
from registry.settings import Settings
from registry.signing import oms, records
from registry.signing.remote import from_wire


class CommitSignatures:
    """The policy both signature paths share: a commit's signature is admitted before the
    version is visible and stored once it is; a posted one is checked the same way."""

    def __init__(self, local: LocalBackend, settings: Settings) -> None:
        self.local = local
        self.settings = settings

    def admit(self, body: Mapping[str, Any] | None, manifest: Mapping[str, Any]
              ) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        origin = f"{manifest['name']}:v{manifest['version']}"
        if body is None:
            if self.settings.require_signed:
                raise SignatureError(
                    f"this server requires signed versions (REGISTRY_REQUIRE_SIGNED): the commit "
                    f"of {origin} carries no signature; push with sign_key= / --sign-key")
            return None
        record, bundles = from_wire(body, f"signature of {origin}")
        return self.check(record, bundles, manifest), bundles

    def check(self, record: dict[str, Any], bundles: Mapping[str, bytes],
              manifest: Mapping[str, Any]) -> dict[str, Any]:
        """``record`` with its signer as the bundle itself names it; under the policy, only if
        the bundle verifies with a key or certificate this server trusts over ``manifest``."""
        origin = f"{manifest['name']}:v{manifest['version']}"
        bundle = bundles.get(record["digest"])
        if bundle is None:
            raise SignatureError(f"the signature of {origin} lists bundle {record['digest']} "
                                 "but does not carry it")
        facts = oms.facts(bundle, origin)
        record = {**record, "method": facts.method, "signer": facts.signer}
        if self.settings.require_signed:
            signer = oms.verify(bundle, records.version_subjects(manifest), origin,
                                public_keys=self.settings.trusted_keys,
                                certificates=self.settings.trusted_certs)
            if signer is None:
                raise SignatureError(
                    f"the signature of {origin} is by {facts.method} {facts.signer}, which this "
                    "server does not trust (REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS)")
            record["signer"] = signer
        return record

    def store(self, name: str, version: int,
              admitted: tuple[dict[str, Any], dict[str, bytes]] | None) -> None:
        if admitted is not None:
            self.local.signatures.add(name, version, *admitted)
