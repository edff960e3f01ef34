"""A pushed directory that carries a ``model.sig`` made by ``model_signing sign``.

Push normalizes the weights, so the version's files are not the files that were signed; what
the registry can prove is that the directory it read was the one signed. The signature is
checked here, on the directory as it is (the reference package hashes its files), against
REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS: a directory that does not match its signature
is refused under REGISTRY_VERIFY=require and warned about otherwise. The original bundle is
kept as the attached file ``provenance/model.sig`` and the signer recorded in the manifest's
``source["signed_files"]``, so a pulled version shows "normalized from files signed by X".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SignatureError
from ..settings import Settings
from . import oms

log = logging.getLogger(__name__)
PROVENANCE_NAME = "provenance/model.sig"


def check_source(model: object, named: Mapping[str, Path], settings: Settings
                 ) -> tuple[dict[str, Path], dict[str, Any] | None]:
    """(the files to attach, with a directory's ``model.sig`` renamed to
    :data:`PROVENANCE_NAME`; the ``signed_files`` fact to record, None without a signature)."""
    out = dict(named)
    signature = out.pop(oms.SIGNATURE_NAME, None)
    if signature is None or not isinstance(model, (str, os.PathLike)) \
            or not Path(model).is_dir():
        return dict(named), None
    directory = Path(model)
    found = oms.facts(oms.read_bounded(signature), str(directory)[:200])
    fact: dict[str, Any] = {"method": found.method, "signer": found.signer, "verified": False,
                            "file": PROVENANCE_NAME}
    if settings.verify != "off":
        try:
            signer = oms.verify_directory(directory, signature,
                                          public_keys=settings.trusted_keys,
                                          certificates=settings.trusted_certs)
        except SignatureError as exc:
            if settings.verify == "require":
                raise
            log.warning("%s; pushing it anyway (REGISTRY_VERIFY=%s)", exc, settings.verify)
            signer = None
        if signer is None and settings.verify == "require":
            raise SignatureError(
                f"{oms.SIGNATURE_NAME} in {str(directory)[:200]!r} is signed by {found.method} "
                f"{found.signer}, which REGISTRY_TRUSTED_KEYS / REGISTRY_TRUSTED_CERTS do not "
                "trust (REGISTRY_VERIFY=require); add the signer's public key")
        fact["verified"] = signer is not None
    out[PROVENANCE_NAME] = signature
    return dict(sorted(out.items())), fact
