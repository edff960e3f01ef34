"""Signed versions: OpenSSF Model Signing (OMS) bundles through the ``model_signing`` package.

``oms`` wraps the reference package (the only module importing it), ``records`` the signature
records and a version's subjects, ``local`` their storage over a catalog and a store,
``service`` signing, verifying and the pull policy.
"""

from .local import LocalSignatures
from .records import Signature
from .service import SignatureStore

__all__ = ["LocalSignatures", "Signature", "SignatureStore"]
