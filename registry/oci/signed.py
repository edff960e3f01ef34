"""A version's signatures inside its artifact: each OpenSSF Model Signing bundle as a layer
(``application/vnd.dev.sigstore.bundle.v0.3+json``, at ``signatures/<hex>.sig``) and the
signature records as one more (``application/vnd.registry.signatures.v1+json``, the store's
own ``.signatures.json`` form).

Read back, the artifact's layers are a read-only :class:`SignatureStore`: a pull applies the
``REGISTRY_VERIFY`` policy with it before a byte of weights is loaded, and an import that keeps
the version's name and number stores the records and bundles with the imported version, so
``registry verify`` passes on it as on the original.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..caching.cache import SIGNATURE_MEMOS
from ..errors import OciArtifactError, SignatureError
from ..io.digests import sha256_bytes
from ..settings import Settings
from ..signing import SignatureStore, service
from ..signing import records as sig_records
from ..signing.oms import MAX_BUNDLE_BYTES
from . import modelpack
from .pull import LayerFetcher

MAX_RECORDS_BYTES = 1 << 20


def layers(store: SignatureStore | None,
           manifest: Mapping[str, Any]) -> tuple[list[modelpack.Layer], dict[str, bytes]]:
    """The signature layers of a version and their bytes by digest ([] when unsigned)."""
    listed = [] if store is None else store.listed(manifest["name"], manifest["version"])
    if not listed:
        return [], {}
    out: list[modelpack.Layer] = []
    data: dict[str, bytes] = {}
    for record in listed:
        for f in sig_records.Signature.from_record(record).files():
            if f.digest not in data:
                data[f.digest] = store.bundle(f.digest, f.size)  # type: ignore[union-attr]
                out.append(modelpack.Layer(modelpack.SIGNATURE_BUNDLE, f.digest, f.size, f.name))
    body = sig_records.dumps(manifest["name"], manifest["version"], listed)
    data[sha256_bytes(body)] = body
    out.append(modelpack.Layer(modelpack.SIGNATURE_RECORDS, sha256_bytes(body), len(body),
                               modelpack.SIGNATURE_RECORDS_PATH))
    return out, data


class ArtifactSignatures:
    """The signatures an artifact carries, read through its verified layers."""

    def __init__(self, artifact: modelpack.Artifact, fetched: LayerFetcher, origin: str) -> None:
        self.artifact, self.fetched, self.origin = artifact, fetched, origin

    def listed(self, name: str, version: int) -> list[dict[str, Any]]:
        found = self.artifact.of_type(modelpack.SIGNATURE_RECORDS)
        if not found:
            return []
        layer = found[0]
        if layer.size > MAX_RECORDS_BYTES:
            raise OciArtifactError(f"{self.origin}: its signature records declare {layer.size} "
                                   f"bytes, more than {MAX_RECORDS_BYTES}; it was not used")
        with self.fetched.open(layer.digest, layer.size) as fh:
            data = fh.read()
        return sig_records.loads(data, name, version, f"{self.origin} {layer.digest}")

    def bundle(self, digest: str, size: int) -> bytes:
        held = {(x.digest, x.size) for x in self.artifact.of_type(modelpack.SIGNATURE_BUNDLE)}
        if (digest, size) not in held or size > MAX_BUNDLE_BYTES:
            raise SignatureError(f"{self.origin}: a signature record names bundle {digest} "
                                 f"({size} bytes), which is not a bundle layer of the artifact "
                                 f"of at most {MAX_BUNDLE_BYTES} bytes; it was not used")
        with self.fetched.open(digest, size) as fh:
            return fh.read()

    def add(self, name: str, version: int, record: Mapping[str, Any],
            bundles: Mapping[str, bytes]) -> dict[str, Any]:
        raise SignatureError(f"{self.origin} is read from an OCI registry; sign the version "
                             "once it is imported (`registry oci pull`, then `registry sign`)")

    def copy_to(self, store: SignatureStore, manifest: Mapping[str, Any]) -> int:
        """Store every signature of ``manifest`` (the imported version, same name and number
        as signed) in ``store``; how many."""
        listed = self.listed(manifest["name"], manifest["version"])
        for record in listed:
            files = sig_records.Signature.from_record(record).files()
            store.add(manifest["name"], manifest["version"], record,
                      {f.digest: self.bundle(f.digest, f.size) for f in files})
        return len(listed)


def enforce(store: SignatureStore, manifest: Mapping[str, Any], settings: Settings) -> None:
    """The pull policy (REGISTRY_VERIFY) on an artifact's version, before anything is loaded."""
    service.enforce(store, manifest, settings.verify, public_keys=settings.trusted_keys,
                    certificates=settings.trusted_certs,
                    remembered=settings.cache_dir / SIGNATURE_MEMOS)
