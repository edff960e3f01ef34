"""The signing half of the Registry facade: ``sign``, ``verify`` and the hooks by which push,
show and save_pretrained take part (a pull's signature policy is a stage of
:mod:`registry.pipelines.pull`; declared as a mixin so the facade stays one screen of
calls). Every method is a thin call of :mod:`registry.signing.service` with the backend's
signature store and the settings' policy."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..manifest import ModelVersion
from ..model import devices as dev
from ..pretrained_files import planned_files
from ..refs import Ref, parse
from ..trust.record_check import checked
from ..versions import Versions
from . import push, service
from .records import Signature
from .remote import RemoteSignatures, wire

if TYPE_CHECKING:
    from ..catalog.records import VersionRecord

PathLike = str | os.PathLike[str]


class SignedVersions(Versions):
    """Signatures of versions (OpenSSF Model Signing) over :class:`Versions`; :class:`Registry`
    builds on it."""

    def sign(self, ref: str | Ref, *, key: PathLike, certificate: PathLike | None = None,
             chain: Sequence[PathLike] = ()) -> Signature:
        """Sign version ``ref`` with an EC private key (PEM), or with the key and its
        ``certificate`` plus the ``chain`` up to its CA: an OpenSSF Model Signing bundle over
        every file of the version and its manifest, stored with it. A version may carry several
        signatures (producer, reviewer). Keyless Sigstore signing needs the network to reach
        Sigstore's CA and log, so it is not offered here."""
        record = checked(self._backend.resolve(parse(ref)))
        return service.sign(
            self._backend.signatures, record.manifest, key=Path(key),
            certificate=None if certificate is None else Path(certificate),
            chain=[Path(c) for c in chain], pretrained=planned_files(record.manifest))

    def verify(self, ref: str | Ref, *, public_keys: Sequence[PathLike] | None = None,
               certificates: Sequence[PathLike] | None = None,
               fast: bool = False) -> list[Signature]:
        """The signatures of ``ref`` that verify with ``public_keys`` (PEM) or through a chain
        to ``certificates`` (CA PEM); by default REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS.
        A signature whose key is trusted but which does not verify raises SignatureError.

        Where one verifies, every file it covers is hashed again as stored (the weights read
        once, through the verified cache over a server): a stored byte changed since the push
        raises SignatureError naming the file. ``fast=True`` checks the signatures against the
        manifest's digests only, reading no weight."""
        record = checked(self._backend.resolve(parse(ref)))
        keys = self.settings.trusted_keys if public_keys is None else public_keys
        certs = self.settings.trusted_certs if certificates is None else certificates
        good, _unknown = service.verify(
            self._backend.signatures, record.manifest, public_keys=[Path(k) for k in keys],
            certificates=[Path(c) for c in certs])
        if good and not fast:
            service.rehash(self._backend.open_blob, record.manifest)
        return good

    # -- hooks of the facade's pipelines ----------------------------------------------------

    def _signed_source(self, model: object, named: Mapping[str, Path],
                       source: dict[str, Any]) -> dict[str, Path]:
        """A pushed directory's ``model.sig``, checked and kept (registry/signing/push.py)."""
        files, fact = push.check_source(model, named, self.settings)
        if fact is not None:
            source["signed_files"] = fact
        return files

    @contextlib.contextmanager
    def _signing_commit(self, sign_key: PathLike | None) -> Iterator[None]:
        """Over a server, a push with ``sign_key`` sends its signature with the commit (a
        server may refuse unsigned commits); the embedded registry signs once committed."""
        store = self._backend.signatures
        if sign_key is None or not isinstance(store, RemoteSignatures):
            yield
            return
        store.commit_signer = lambda manifest: wire(*service.make(
            manifest, key=Path(sign_key), pretrained=planned_files(manifest)))
        try:
            yield
        finally:
            store.commit_signer = None

    def _signed_push(self, mv: ModelVersion, sign_key: PathLike | None) -> ModelVersion:
        if sign_key is not None and not isinstance(self._backend.signatures, RemoteSignatures):
            self.sign(mv.ref, key=sign_key)
        return self._with_signatures(mv) if sign_key is not None else mv

    def _signed_directory(self, record: VersionRecord, dtype: dev.DtypeRequest,
                          root: Path) -> Path:
        """``model.sig`` for a directory written with the stored bytes (``dtype="auto"``)."""
        if dev.parse_dtype(dtype) is None:
            service.write_directory_signature(self._backend.signatures, record.manifest, root)
        return root
