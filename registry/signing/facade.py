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
        """:meth:`registry.Registry.sign`: one bundle over the version's files and manifest."""
        record = checked(self._backend.resolve(parse(ref)))
        return service.sign(
            self._backend.signatures, record.manifest, key=Path(key),
            certificate=None if certificate is None else Path(certificate),
            chain=[Path(c) for c in chain], pretrained=planned_files(record.manifest))

    def verify(self, ref: str | Ref, *, public_keys: Sequence[PathLike] | None = None,
               certificates: Sequence[PathLike] | None = None,
               fast: bool = False) -> list[Signature]:
        """:meth:`registry.Registry.verify`: the trusted signatures that verify, and (unless
        ``fast``) every covered file hashed again as stored."""
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
