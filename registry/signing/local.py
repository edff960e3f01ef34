"""Signatures over a catalog and an object store (the embedded registry and the server).

A bundle is a blob (``blobs/sha256/<hex>``) and a catalog version file of role ``signature``
(so gc keeps it while the version lives); the records (method, signer, time) are in the store's
``manifests/<name>/v<N>.signatures.json``, which ``registry db rebuild`` reads back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError, SignatureError
from ..files import VersionFile
from ..io.digests import sha256_bytes
from ..manifest import blob_key
from ..store import Staging, layout
from ..trust import validate
from . import records
from .oms import MAX_BUNDLE_BYTES

if TYPE_CHECKING:
    from ..catalog.repository import Catalog
    from ..store import ObjectStore


class LocalSignatures:
    """The signatures of the versions of one catalog and store."""

    def __init__(self, catalog: Catalog, store: ObjectStore) -> None:
        self.catalog = catalog
        self.store = store
        # Asked once: the protocol check reads ``staging_dir``, which makes the folder.
        self.on_filesystem = isinstance(store, Staging)

    def listed(self, name: str, version: int) -> list[dict[str, Any]]:
        """The checked records of ``name:vN``, oldest first ([] when it has none). On a store
        across the network (S3) the catalog's bundle rows are asked first, so an unsigned
        version costs no round trip; on this filesystem a stat is cheaper than a query, and
        keeps a warm resolve query-free (catalog/warm.py)."""
        if not self.on_filesystem \
                and not self.catalog.has_signature_files(name, version):
            return []
        return self._stored_list(name, version)

    def _stored_list(self, name: str, version: int) -> list[dict[str, Any]]:
        """The store's list of ``name:vN``, checked (no catalog query: :meth:`add` reads it
        while it holds the catalog's write lock)."""
        key = records.store_key(name, version)
        size = self.store.has(key)
        if size is None:
            return []
        data = validate.stored_bytes(size, key, self.store.get_bytes)
        return records.loads(data, name, version, key)

    def bundle(self, digest: str, size: int) -> bytes:
        """The bytes of a bundle, read only within the bundle bound and checked against its
        digest."""
        key = blob_key(digest)
        have = self.store.has(key)
        if have is None:
            raise NotFoundError(f"signature bundle {digest} is not in the store; run `registry "
                                "db rebuild` or sign the version again")
        if have > MAX_BUNDLE_BYTES or have != size:
            raise SignatureError(f"signature bundle {digest} holds {have} bytes, not the {size} "
                                 f"recorded (a bundle is at most {MAX_BUNDLE_BYTES}); it was "
                                 "not used")
        data = self.store.get_bytes(key)
        if sha256_bytes(data) != digest:
            raise SignatureError(f"signature bundle {digest} does not hash to its digest; it "
                                 "was not used")
        return data

    def add(self, name: str, version: int, record: Mapping[str, Any],
            bundles: Mapping[str, bytes]) -> dict[str, Any]:
        """Store a signature of ``name:vN``: catalog rows first (a gc running meanwhile keeps
        the blobs), then the bundles, then the record in the store's list."""
        record = records.check(record, f"signature of {name}:v{version}")
        signature = records.Signature.from_record(record)
        files = signature.files()
        for f in files:
            data = bundles.get(f.digest)
            if data is None or sha256_bytes(data) != f.digest or len(data) != f.size:
                raise SignatureError(f"signature of {name}:v{version} lists bundle {f.digest} "
                                     "but its bytes were not given or differ")
        self.add_rows(name, version, files)
        for f in files:
            key = blob_key(f.digest)
            if self.store.has(key) != f.size:
                self.store.put_bytes(key, bundles[f.digest])
        # The store's list is read, appended to and written back under the model's lock, so
        # a concurrent signer's record is never overwritten by a list read before it landed.
        with self.catalog.signatures_locked(name):
            listed = [r for r in self._stored_list(name, version)
                      if r["digest"] != record["digest"]]
            listed.append(record)
            if len(listed) > records.MAX_SIGNATURES:
                raise SignatureError(f"{name}:v{version} already has {records.MAX_SIGNATURES} "
                                     "signatures; no more can be added")
            self.store.put_bytes(records.store_key(name, version),
                                 records.dumps(name, version, listed))
        with contextlib.suppress(Exception):
            self.catalog.set_mirror_state(name, version, None)  # the mirror tags signers
        return record

    def add_rows(self, name: str, version: int, files: list[VersionFile]) -> None:
        self.catalog.add_signature_files(name, version, files)

    def stored(self) -> list[tuple[str, int, list[dict[str, Any]]]]:
        """Every ``.signatures.json`` in the store, checked (read before a rebuild changes the
        catalog, so a hostile one refuses the rebuild)."""
        found = []
        for key in self.store.list(layout.MANIFESTS):
            name, version, suffix = layout.parse_manifest_key(key)
            if suffix == layout.SIGNATURES:
                data = validate.stored_bytes(self.store.has(key), key, self.store.get_bytes)
                found.append((name, version, records.loads(data, name, version, key)))
        return found

    def restore(self, found: list[tuple[str, int, list[dict[str, Any]]]]) -> int:
        """Catalog rows for what :meth:`stored` read, once the versions were restored (a
        deleted version's list, left in the store, is skipped: its number is never reused)."""
        return self.catalog.restore_signature_files([
            (name, version, [f for r in listed for f in records.Signature.from_record(r).files()])
            for name, version, listed in found])
