"""Signature records: what a signature of a version says (its bundle's digest, method, signer,
time), in the store's ``manifests/<name>/v<N>.signatures.json``, on the wire and in ``show``;
and the subjects a version's bundle signs.

Every record read back (from a store, a server or a request) passes :func:`check` before use:
it names blobs, so digests, sizes and lengths are checked against their grammars and bounds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError, RegistryError, quoted
from ..files import VersionFile, version_files
from ..io.digests import check_digest
from ..store import layout
from ..trust import boundedjson
from .oms import MAX_BUNDLE_BYTES

# The subject under which a bundle signs the version's manifest. A name no attached file can
# have (attached names never start with '.'), so it cannot be shadowed.
MANIFEST_SUBJECT = ".registry/manifest.json"
# Fields of the manifest that change after the commit (set_tags rewrites them) or that only
# checksum the store's copy: not signed.
_UNSIGNED_FIELDS = ("tags", "manifest_sha256")
MAX_SIGNATURES = 64
METHODS = ("key", "certificate", "sigstore")
FIELDS = ("digest", "size", "method", "signer", "created_at", "pretrained")


@dataclass(frozen=True)
class Signature:
    """One signature of a version: an OMS bundle stored with it.

    ``signer`` is ``sha256:<hex>`` of the public key (``method="key"``) or the certificate's
    identity; ``pretrained`` is the digest of a second bundle, over the files
    ``save_pretrained`` writes (the ``model.sig`` of that directory), when one was made.
    ``verified`` is True for a signature :meth:`Registry.verify` checked with a trusted key."""

    digest: str
    size: int
    method: str
    signer: str
    created_at: str
    pretrained: str | None = None
    pretrained_size: int = 0
    verified: bool = False

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, verified: bool = False) -> Signature:
        extra = record.get("pretrained") or {}
        return cls(record["digest"], record["size"], record["method"], record["signer"],
                   record["created_at"], extra.get("digest"), int(extra.get("size", 0)),
                   verified)

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "method": self.method, "signer": self.signer,
                "created_at": self.created_at, "verified": self.verified,
                "status": "verified" if self.verified else "unverified"}

    def files(self) -> list[VersionFile]:
        """Its bundles as version files of role ``signature``."""
        out = [VersionFile("signature", f"signatures/{self.digest[7:]}.sig", self.digest,
                           self.size)]
        if self.pretrained:
            out.append(VersionFile("signature", f"signatures/{self.pretrained[7:]}.sig",
                                   self.pretrained, self.pretrained_size))
        return out


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 hex of the manifest's canonical JSON without its mutable fields: it names the
    version (name, number), its files and everything a pull builds from."""
    body = {k: v for k, v in manifest.items() if k not in _UNSIGNED_FIELDS}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def version_subjects(manifest: Mapping[str, Any]) -> dict[str, str]:
    """name -> sha256 hex of every file of a (checked) manifest: its weight shards, its
    attached files, and the manifest itself under :data:`MANIFEST_SUBJECT`."""
    subjects = {f.name: f.digest[7:] for f in version_files(manifest)}
    subjects[MANIFEST_SUBJECT] = manifest_digest(manifest)
    return subjects


def store_key(name: str, version: int) -> str:
    return layout.signatures_key(name, version)


def check(record: object, origin: str) -> dict[str, Any]:
    """``record`` if it is a well-formed signature record, else ManifestError naming the field."""
    def bad(what: str, value: object) -> ManifestError:
        return ManifestError(f"signature record in {origin} has an invalid {what} "
                             f"{quoted(value, 80)}; it was not used")

    if not isinstance(record, Mapping) or set(record) != set(FIELDS):
        raise ManifestError(f"signature record in {origin} is not an object with exactly the "
                            f"fields {', '.join(FIELDS)}; it was not used")
    _blob(record, origin, bad)
    if record["method"] not in METHODS:
        raise bad("method", record["method"])
    for name in ("signer", "created_at"):
        if not isinstance(record[name], str) or not 0 < len(record[name]) <= 256:
            raise bad(name, record[name])
    extra = record["pretrained"]
    if extra is not None:
        if not isinstance(extra, Mapping) or set(extra) != {"digest", "size"}:
            raise bad("pretrained", extra)
        _blob(extra, origin, bad)
    return json.loads(json.dumps(dict(record)))


def _blob(record: Mapping[str, Any], origin: str, bad: Any) -> None:
    try:
        check_digest(record["digest"])
    except RegistryError:
        raise bad("digest", record["digest"]) from None
    size = record["size"]
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_BUNDLE_BYTES:
        raise bad("size", size)


def check_list(data: object, origin: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or len(data) > MAX_SIGNATURES:
        raise ManifestError(f"{origin} does not hold a list of at most {MAX_SIGNATURES} "
                            "signature records; it was not used")
    return [check(r, origin) for r in data]


def dumps(name: str, version: int, records: list[dict[str, Any]]) -> bytes:
    return json.dumps({"name": name, "version": version, "signatures": records}, indent=1,
                      sort_keys=True).encode()


def loads(data: bytes, name: str, version: int, origin: str) -> list[dict[str, Any]]:
    """The records of a stored ``.signatures.json``, checked; refused if it names another
    version than the key it was found under."""
    try:
        parsed = boundedjson.loads(data)
    except ValueError:
        raise ManifestError(f"store object {origin} is not valid JSON; remove or repair it, then "
                            "run `registry db rebuild` again") from None
    if not isinstance(parsed, dict) or parsed.get("name") != name \
            or parsed.get("version") != version:
        raise ManifestError(f"store object {origin} does not describe the signatures of {name}:v"
                            f"{version}; remove or repair it")
    return check_list(parsed.get("signatures"), origin)
