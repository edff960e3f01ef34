"""A pushed directory that carries a ``model.sig`` made by ``model_signing sign``.

Push normalizes the weights, so the version's files are not the files that were signed; what
the registry can prove is that the directory it read was the one signed. The signature is
checked here, on the directory as it is (the reference package hashes its files), against
REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS: a directory that does not match its signature
is refused under REGISTRY_VERIFY=require and if-signed when its signer is trusted (an unknown
signer's is kept, recorded as unverified, and warned about). The original bundle is
kept as the attached file ``provenance/model.sig`` and the signer recorded in the manifest's
``source["signed_files"]``, so a pulled version shows "normalized from files signed by X".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..attachments import PROVENANCE_NAME
from ..errors import SignatureError
from ..settings import Settings
from . import oms

log = logging.getLogger(__name__)


def check_source(model: object, named: Mapping[str, Path], settings: Settings
                 ) -> dict[str, Any] | None:
    """The ``signed_files`` fact to record of a pushed directory ``model`` whose collected files
    ``named`` hold a ``model.sig``, checked; None without one. The signature is attached as
    :data:`PROVENANCE_NAME` (:func:`registry.attachments.as_provenance`)."""
    signature = named.get(oms.SIGNATURE_NAME)
    if signature is None or not isinstance(model, (str, os.PathLike)) \
            or not Path(model).is_dir():
        return None
    directory = Path(model)
    found = oms.facts(oms.read_bounded(signature), str(directory)[:200])
    fact: dict[str, Any] = {"method": found.method, "signer": found.signer, "verified": False,
                            "status": "unchecked (REGISTRY_VERIFY=off)", "file": PROVENANCE_NAME}
    if settings.verify != "off":
        # A signature by a trusted key that does not verify (the files changed after
        # `model_signing sign`) refuses the push under if-signed as under require.
        try:
            signer = oms.verify_directory(directory, signature,
                                          public_keys=settings.trusted_keys,
                                          certificates=settings.trusted_certs)
        except SignatureError as exc:
            raise SignatureError(f"{exc}; the files changed since they were signed, or the "
                                 f"signature is not theirs: it was not pushed "
                                 f"(REGISTRY_VERIFY={settings.verify}); sign the files again")\
                from None
        if signer is None and settings.verify == "require":
            raise SignatureError(
                f"{oms.SIGNATURE_NAME} in {str(directory)[:200]!r} is signed by {found.method} "
                f"{found.signer}, which REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS do not "
                "trust (REGISTRY_VERIFY=require); add the signer's public key")
        fact["verified"] = signer is not None
        fact["status"] = "verified" if signer is not None else "unverified: signer not trusted"
        if signer is None:
            log.warning("%s in %s is signed by %s %s, which is not trusted: kept as %s and "
                        "listed as unverified", oms.SIGNATURE_NAME, str(directory)[:200],
                        found.method, found.signer, PROVENANCE_NAME)
    return fact
