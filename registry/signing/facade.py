"""The facade's signing calls: ``sign`` and ``verify`` of a version, and the signature of a
directory ``save_pretrained`` writes. :class:`registry.Registry` holds a :class:`Signing` and
delegates to it; a push's signing steps are :mod:`registry.signing.push`, a pull's signature
policy a stage of :mod:`registry.pipelines.pull`. Every method is a thin call of
:mod:`registry.signing.service` with the backend's signature store and the settings' policy."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..model import devices as dev
from ..pretrained_files import planned_files
from ..refs import Ref, parse
from ..settings import Settings
from ..trust.record_check import checked
from . import service
from .records import Signature

if TYPE_CHECKING:
    from ..backends import Backend
    from ..catalog.records import VersionRecord

PathLike = str | os.PathLike[str]


class Signing:
    """Signatures of versions (OpenSSF Model Signing) in ``backend``'s signature store, checked
    against ``settings``' trusted keys and certificates."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self._backend = backend

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

    def signed_directory(self, record: VersionRecord, dtype: dev.DtypeRequest,
                         root: Path) -> Path:
        """``model.sig`` for a directory written with the stored bytes (``dtype="auto"``)."""
        if dev.parse_dtype(dtype) is None:
            service.write_directory_signature(self._backend.signatures, record.manifest, root)
        return root
