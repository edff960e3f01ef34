"""OpenSSF Model Signing (OMS) bundles through the reference package, ``model_signing``.

The only module that imports it (lazily: it is the ``signing`` extra). Nothing here re-derives the
format: a bundle is made by ``model_signing.signing.Config().sign`` and checked by
``model_signing.verifying.Config().verify``. What we add is a hashing configuration that hands
those calls digests we already hold (:class:`Precomputed`), so signing a version and verifying
one never read its weights: the registry's store and verified cache already proved every blob's
sha256.

The serialization recorded in a bundle is the reference CLI's own (``files``, sha256, no
symlinks, ignoring ``model.sig`` and git files), so a bundle made for the files of a directory
verifies with ``model_signing verify key DIR --signature DIR/model.sig``.
"""

from __future__ import annotations

import atexit
import base64
import copy
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ..errors import SignatureError, quoted
from ..trust import boundedjson
from . import memo

Method = Literal["key", "certificate", "sigstore"]
SIGNATURE_NAME = "model.sig"
# The paths the reference CLI leaves out of a directory's manifest (its own defaults).
IGNORED_PATHS = (SIGNATURE_NAME, ".git", ".gitattributes", ".github", ".gitignore")
# A bundle is a few KiB (a certificate chain a few more); anything much larger is not one.
MAX_BUNDLE_BYTES = 1 * 2**20
_SERIALIZATION = {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                  "ignore_paths": list(IGNORED_PATHS)}


@dataclass(frozen=True)
class BundleFacts:
    """What a bundle says about its signer, read without trusting it."""

    method: Method
    signer: str  # "sha256:<hex>" of the public key (PEM SubjectPublicKeyInfo), or a cert subject
    certificates: tuple[bytes, ...] = ()  # DER, leaf first


def _imports() -> Any:
    try:
        import model_signing.hashing
        import model_signing.manifest
        import model_signing.signing
        import model_signing.verifying
    except ImportError as exc:
        raise SignatureError(
            f"signing needs the model-signing package ({exc.name or exc}); install it with "
            "`pip install 'registry[signing]'`") from None
    return model_signing


def _manifest(model_name: str, subjects: Mapping[str, str]) -> Any:
    ms = _imports()
    # The digest value type the public manifest API takes lives in the private hashing layer.
    from model_signing._hashing.hashing import Digest

    serialization = ms.manifest.SerializationType.from_args(_SERIALIZATION)
    items = [serialization.new_item(name, Digest("sha256", bytes.fromhex(hexdigest)))
             for name, hexdigest in sorted(subjects.items())]
    return ms.manifest.Manifest(model_name, items, serialization)


def _precomputed(model_name: str, subjects: Mapping[str, str]) -> Any:
    """A ``model_signing.hashing.Config`` whose ``hash`` returns the manifest of ``subjects``
    (name -> sha256 hex) instead of reading files."""
    return _precomputed_class()(_manifest(model_name, subjects))


@functools.cache
def _precomputed_class() -> type:
    """The class of :func:`_precomputed`'s configurations, made once (a class per call cost
    more than the ECDSA check of a pull under REGISTRY_VERIFY)."""
    ms = _imports()

    class Precomputed(ms.hashing.Config):  # type: ignore[name-defined]
        def __init__(self, built: Any) -> None:
            super().__init__()
            self.built = built

        def hash(self, model_path: Any, *, files_to_hash: Iterable[Any] | None = None) -> Any:
            return self.built

        def add_ignored_paths(self, *, model_path: Any, paths: Iterable[Any]) -> None:
            """Nothing to ignore: no directory is walked, the subjects are the files."""

    return Precomputed


def check_subjects(subjects: Mapping[str, str]) -> None:
    for name, digest in subjects.items():
        if PurePosixPath(name).is_absolute() or ".." in name.split("/") or \
                len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise SignatureError(f"cannot sign subject {quoted(name, 80)} with digest "
                                 f"{quoted(digest, 80)}: not a relative path and a sha256")


def sign(subjects: Mapping[str, str], model_name: str, *, key: str | Path,
         certificate: str | Path | None = None,
         chain: Sequence[str | Path] = ()) -> bytes:
    """An OMS bundle (JSON bytes) over ``subjects`` (name -> sha256 hex), signed with the EC
    private key ``key`` (PEM), or with ``key`` and its ``certificate`` (plus ``chain``)."""
    ms = _imports()
    check_subjects(subjects)
    config = ms.signing.Config().set_hashing_config(_precomputed(model_name, subjects))
    key_path = _pem_file(key, "private key")
    try:
        if certificate is not None:
            if not chain:
                raise SignatureError(
                    f"certificate signing with {str(certificate)[:200]!r} needs its chain: pass "
                    "the issuing CA certificate (and any intermediates) as chain / --chain")
            config.use_certificate_signer(
                private_key=key_path, signing_certificate=_pem_file(certificate, "certificate"),
                certificate_chain=[_pem_file(c, "certificate chain") for c in chain])
        else:
            config.use_elliptic_key_signer(private_key=key_path)
        out = _scratch() / f"{uuid.uuid4().hex}.sig"
        try:
            config.sign(out.parent, out)  # the model path is never read (precomputed)
            return out.read_bytes()
        finally:
            out.unlink(missing_ok=True)
    except SignatureError:
        raise
    except Exception as exc:  # key loading and signing: ValueError, TypeError, cryptography's
        raise SignatureError(
            f"cannot sign with {str(key_path)[:200]!r}"
            f"{' and ' + repr(str(certificate)[:200]) if certificate else ''}: "
            f"{type(exc).__name__}: {str(exc)[:200]}; use an elliptic-curve (P-256/384/521) "
            "private key in PEM (`openssl ecparam -name prime256v1 -genkey -noout`)") from None


def _pem_file(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_file():
        raise SignatureError(f"{what} {str(path)[:200]!r} is not a file; pass the path of a PEM "
                             "file")
    return p


def read_bounded(path: Path) -> bytes:
    """A signature file's bytes, reading at most one byte past the bundle bound (``facts``
    then refuses an oversized one without it ever being read whole)."""
    with open(path, "rb") as fh:
        return fh.read(MAX_BUNDLE_BYTES + 1)


def key_fingerprint(pem: bytes) -> str:
    """``sha256:<hex>`` of a PEM public key as the reference package hints it in a bundle
    (sha256 of its PEM SubjectPublicKeyInfo), or of a private key's public half."""
    from cryptography.hazmat.primitives import serialization

    try:
        loaded: Any = serialization.load_pem_public_key(pem)
    except ValueError:
        try:
            loaded = serialization.load_pem_private_key(pem, None).public_key()
        except (ValueError, TypeError) as exc:
            raise SignatureError(f"not a PEM public or private key ({str(exc)[:120]})") from None
    spki = loaded.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def trusted_file(path: Path) -> tuple[str, bytes]:
    """(``sha256:<hex>``, bytes) of a trusted key or certificate file, read once per version of
    the file (device, inode, size, mtime and ctime, taken from the descriptor that reads it): a pull
    checks its trust anchors without reading each of them several times."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        # ctime too: a file rewritten in place with the same size and mtime is another key.
        identity = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        known = _TRUSTED_FILES.get(identity)
        if known is None:
            data = fh.read()
            known = ("sha256:" + hashlib.sha256(data).hexdigest(), data)
            if len(_TRUSTED_FILES) >= 256:
                _TRUSTED_FILES.clear()
            _TRUSTED_FILES[identity] = known
    return known


def key_signer(path: Path) -> str:
    """The fingerprint of the trusted public key file ``path`` (parsed once per content)."""
    digest, data = trusted_file(path)
    if digest not in _FINGERPRINTS:
        if len(_FINGERPRINTS) >= 256:
            _FINGERPRINTS.clear()
        _FINGERPRINTS[digest] = key_fingerprint(data)  # SignatureError when it is not a key
    return _FINGERPRINTS[digest]


_TRUSTED_FILES: dict[tuple[str, int, int, int, int, int], tuple[str, bytes]] = {}
_FINGERPRINTS: dict[str, str] = {}


def facts(bundle: bytes, origin: str) -> BundleFacts:
    """The signer a bundle names (not yet verified); SignatureError if it is not a bundle."""
    if len(bundle) > MAX_BUNDLE_BYTES:
        raise SignatureError(f"signature of {origin} is {len(bundle)} bytes, over the "
                             f"{MAX_BUNDLE_BYTES}-byte limit of a bundle; it was not used")
    try:
        data = boundedjson.loads(bundle)
        material = data["verificationMaterial"]
        envelope = data["dsseEnvelope"]
        if not isinstance(envelope, dict) or not isinstance(envelope.get("payload"), str):
            raise TypeError("no DSSE payload")
        if "publicKey" in material:
            hint = material["publicKey"].get("hint")
            if not isinstance(hint, str) or len(hint) != 64:
                raise TypeError("no public key hint")
            return BundleFacts("key", "sha256:" + hint.lower())
        chain = material.get("x509CertificateChain") or {}
        certs = tuple(base64.b64decode(c["rawBytes"], validate=True)
                      for c in chain.get("certificates", ()))
        if certs:
            return BundleFacts("certificate", _cert_identity(certs[0]), certs)
        if "certificate" in material:
            leaf = base64.b64decode(material["certificate"]["rawBytes"], validate=True)
            return BundleFacts("sigstore", _cert_identity(leaf), (leaf,))
        raise TypeError("no verification material")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise SignatureError(f"signature of {origin} is not an OMS (Sigstore) bundle "
                             f"({type(exc).__name__}: {str(exc)[:120]}); it was not used"
                             ) from None


def _cert_identity(der: bytes) -> str:
    from cryptography import x509

    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise ValueError(f"bad certificate: {exc}") from None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.RFC822Name)] + \
            [str(v) for v in san.get_values_for_type(x509.UniformResourceIdentifier)]
        if names:
            return names[0][:200]
    except x509.ExtensionNotFound:
        pass
    return cert.subject.rfc4514_string()[:200] or "sha256:" + hashlib.sha256(der).hexdigest()


def verify(bundle: bytes, subjects: Mapping[str, str], origin: str, *,
           public_keys: Sequence[Path] = (), certificates: Sequence[Path] = (),
           remembered: Path | None = None) -> str | None:
    """Check ``bundle`` against ``subjects`` (name -> sha256 hex) with the trusted keys or CA
    certificates. Returns the trusted signer (key fingerprint or certificate identity), None
    when no trusted key or certificate applies to this bundle (it cannot be checked here), and
    raises SignatureError when it applies but the bundle does not verify.

    ``remembered``: a folder where checks by a trusted key that passed are written down
    (:mod:`memo`), so a new process does not repeat one. A written check is believed only
    for this bundle's own signer, and only while that key is trusted."""
    found = facts(bundle, origin)
    check = (hashlib.sha256(bundle).hexdigest(),
             hashlib.sha256(json.dumps(sorted(subjects.items())).encode()).hexdigest(),
             tuple(trusted_file(p)[0] for p in (*public_keys, *certificates)))
    signer = memo.held(check)
    if signer is not None:
        return signer
    written = None
    if remembered is not None and found.method == "key":
        written = memo.file_of(remembered, check)
        if memo.recall(written, found.signer) and \
                any(key_signer(k) == found.signer for k in public_keys):
            signer = found.signer
    if signer is None:
        signer = _verify(bundle, found, subjects, origin, public_keys, certificates)
        if signer is not None and written is not None:
            memo.write(written, signer)
    if signer is not None:
        memo.hold(check, signer)
    return signer


def forget_verified() -> None:
    """Empty this process's memo of verified bundles, as a new process starts with (the checks
    written down in a cache stay; benchmarks measure both)."""
    memo.forget()


def _verify(bundle: bytes, found: BundleFacts, subjects: Mapping[str, str], origin: str,
            public_keys: Sequence[Path], certificates: Sequence[Path]) -> str | None:
    if found.method == "key":
        keys = [k for k in public_keys if key_signer(k) == found.signer]
        if not keys:
            return None
        configure: list[Callable[[], Any]] = [functools.partial(_key_config, k) for k in keys]
    elif found.method == "certificate":
        if not certificates:
            return None
        configure = [functools.partial(_certificates_config, list(certificates))]
    else:
        return None  # Sigstore keyless bundles need the network's trust root (not here)
    sig = _bundle_file(bundle)
    failure = ""
    hashing = _precomputed(origin, subjects)
    for make in configure:
        try:
            # The model path is never read: the hashing config answers with the subjects.
            make().set_hashing_config(hashing).verify(sig.parent, sig)
            return found.signer
        except Exception as exc:  # crypto, chain and manifest failures alike
            failure = _reason(exc)
    if found.method == "certificate" and _chain_failure(failure):
        raise SignatureError(f"signature of {origin} by certificate {found.signer!r} does not "
                             f"verify: {failure}; its chain does not reach "
                             "REGISTRY_TRUSTED_CERTS")
    raise SignatureError(f"signature of {origin} by {found.method} {found.signer} does not "
                         f"verify: {failure}; the version was not used")


def _key_config(key: Path) -> Any:
    """A verifying configuration of the public key file ``key``: a copy of one made once per
    content of the file (reading and parsing the key was a tenth of a cold check). The copy
    shares the stateless verifier and takes its own hashing configuration."""
    digest = trusted_file(key)[0]
    with _LOCK:
        made = _KEY_CONFIGS.get(digest)
    if made is None:
        made = _imports().verifying.Config().use_elliptic_key_verifier(public_key=key)
        with _LOCK:
            if len(_KEY_CONFIGS) >= 256:
                _KEY_CONFIGS.clear()
            _KEY_CONFIGS[digest] = made
    return copy.copy(made)


def _certificates_config(roots: list[Path]) -> Any:
    return _imports().verifying.Config().use_certificate_verifier(certificate_chain=roots)


_KEY_CONFIGS: dict[str, Any] = {}
_LOCK = threading.Lock()


_SCRATCH: list[Path] = []


def _scratch() -> Path:
    if not _SCRATCH:
        folder = Path(tempfile.mkdtemp(prefix="registry-bundles-"))
        atexit.register(shutil.rmtree, folder, True)
        _SCRATCH.append(folder)
    return _SCRATCH[0]


def _bundle_file(bundle: bytes) -> Path:
    """A file holding ``bundle`` (the reference package reads signatures from files), named
    by its digest in one private folder per process: a temporary folder per call cost ~6 ms of
    mkdir/rmdir here, more than the verification itself."""
    path = _scratch() / f"{hashlib.sha256(bundle).hexdigest()}.sig"
    if not path.is_file():
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(bundle)
        os.replace(tmp, path)
    return path


def _chain_failure(reason: str) -> bool:
    return "certificate" in reason.lower() or "issuer" in reason.lower()


def _reason(exc: Exception) -> str:
    """What did not match, in words: the reference package lists extra, missing and changed
    files (its message prints raw digest objects, which we leave out)."""
    text = str(exc) or type(exc).__name__
    if type(exc).__name__ == "InvalidSignature":
        return "the signature bytes are not the key's signature of its payload"
    if "Signature mismatch" not in text:
        return text[:400]
    parts = []
    for pattern, what in ((r"Extra files found in model '[^']*': ([^\"'\]]+)",
                           "files it does not cover: "),
                          (r"Missing files in model '[^']*': ([^\"'\]]+)",
                           "files it lists that are not there: "),
                          (r"Hash mismatch for \\*'([^'\\]+)\\*'", "Hash mismatch for ")):
        found = re.findall(pattern, text)
        if found:
            parts.append(what + ", ".join(found))
    return "; ".join(parts)[:400] or text[:400]


def verify_directory(directory: Path, signature: Path, *, public_keys: Sequence[Path] = (),
                     certificates: Sequence[Path] = ()) -> str | None:
    """Check a directory signed by ``model_signing sign`` (the reference package hashes its
    files): the trusted signer, None when no trusted key applies, else SignatureError."""
    bundle = read_bounded(signature)
    origin = str(directory)[:200]
    found = facts(bundle, origin)
    ms = _imports()
    if found.method == "key":
        keys = [k for k in public_keys if key_signer(k) == found.signer]
        configs = [ms.verifying.Config().use_elliptic_key_verifier(public_key=k) for k in keys]
    elif found.method == "certificate" and certificates:
        configs = [ms.verifying.Config().use_certificate_verifier(
            certificate_chain=list(certificates))]
    else:
        configs = []
    if not configs:
        return None
    failure = ""
    for config in configs:
        try:
            config.verify(directory, signature)
            return found.signer
        except Exception as exc:
            failure = _reason(exc)
    raise SignatureError(f"{signature.name} in {origin} (by {found.method} {found.signer}) does "
                         f"not verify: {failure}")
