"""Signing and verifying versions: functions of a signature store (local or remote), a checked
manifest and the caller's keys. Nothing here reads a weight: a version's subjects are the
digests its manifest lists, which every pull verifies as it reads the blobs anyway.

A push signs through :func:`commit_signer` (around the commit) and :func:`sign_committed` (after
it), steps of :mod:`registry.pipelines.push`. The pull policy (``REGISTRY_VERIFY``) is
:func:`enforce`:

- ``off``: signatures are not looked at;
- ``if-signed`` (default): every signature whose key or certificate is trusted must verify;
  signatures nobody here trusts are skipped with a warning;
- ``require``: as ``if-signed``, and at least one signature must verify with a trusted key or
  certificate; an unsigned version is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from ..errors import DigestMismatchError, SignatureError
from ..files import version_files
from ..io.digests import sha256_bytes, sha256_file
from ..pretrained_files import planned_files
from ..refs import Ref
from ..trust.record_check import checked
from . import oms, records
from .records import Signature
from .remote import RemoteSignatures, wire

if TYPE_CHECKING:
    from ..catalog.records import VersionRecord

log = logging.getLogger(__name__)

class SignatureStore(Protocol):
    """Where a backend keeps signatures (LocalSignatures, RemoteSignatures)."""

    def listed(self, name: str, version: int) -> list[dict[str, Any]]: ...
    def bundle(self, digest: str, size: int) -> bytes: ...
    def add(self, name: str, version: int, record: Mapping[str, Any],
            bundles: Mapping[str, bytes]) -> dict[str, Any]: ...

def make(manifest: Mapping[str, Any], *, key: str | Path, certificate: str | Path | None = None,
         chain: Sequence[str | Path] = (),
         pretrained: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A signature record of a (checked) manifest and its bundles by digest: one over the
    version's subjects and, when ``pretrained`` (name -> sha256 hex of the files
    ``save_pretrained`` writes) is given, one over that directory."""
    origin = f"{manifest['name']}:v{manifest['version']}"
    bundle = oms.sign(records.version_subjects(manifest), origin, key=key,
                      certificate=certificate, chain=chain)
    found = oms.facts(bundle, origin)
    bundles = {sha256_bytes(bundle): bundle}
    record: dict[str, Any] = {
        "digest": sha256_bytes(bundle), "size": len(bundle), "method": found.method,
        "signer": found.signer, "created_at": datetime.now(timezone.utc).isoformat(),
        "pretrained": None}
    if pretrained is not None:
        extra = oms.sign(pretrained, str(manifest["name"]), key=key, certificate=certificate,
                         chain=chain)
        bundles[sha256_bytes(extra)] = extra
        record["pretrained"] = {"digest": sha256_bytes(extra), "size": len(extra)}
    return record, bundles

def sign(store: SignatureStore, manifest: Mapping[str, Any], *, key: str | Path,
         certificate: str | Path | None = None, chain: Sequence[str | Path] = (),
         pretrained: Mapping[str, str] | None = None) -> Signature:
    """Sign a committed version and store the signature with it."""
    record, bundles = make(manifest, key=key, certificate=certificate, chain=chain,
                           pretrained=pretrained)
    kept = store.add(manifest["name"], manifest["version"], record, bundles)
    return Signature.from_record(kept)

@contextlib.contextmanager
def commit_signer(store: SignatureStore, sign_key: str | os.PathLike[str] | None
                  ) -> Iterator[None]:
    """Around a push's commit: over a server, a push with ``sign_key`` sends its signature with
    the commit (a server may refuse unsigned commits); the embedded registry signs once
    committed (:func:`sign_committed`)."""
    if sign_key is None or not isinstance(store, RemoteSignatures):
        yield
        return
    store.commit_signer = lambda manifest: wire(*make(
        manifest, key=Path(sign_key), pretrained=planned_files(manifest)))
    try:
        yield
    finally:
        store.commit_signer = None


def sign_committed(store: SignatureStore, committed: VersionRecord,
                   sign_key: str | os.PathLike[str] | None,
                   resolve: Callable[[Ref], VersionRecord]) -> None:
    """Sign the version a push with ``sign_key`` committed as ``Registry.sign`` does (resolved
    and checked again); over a server, :func:`commit_signer` signed it with its commit."""
    if sign_key is None or isinstance(store, RemoteSignatures):
        return
    record = checked(resolve(Ref(committed.name, committed.version)))
    sign(store, record.manifest, key=Path(sign_key), pretrained=planned_files(record.manifest))


def verify(store: SignatureStore, manifest: Mapping[str, Any], *,
           public_keys: Sequence[Path] = (), certificates: Sequence[Path] = (),
           listed: list[dict[str, Any]] | None = None, remembered: Path | None = None
           ) -> tuple[list[Signature], list[Signature]]:
    """(signatures that verify with a trusted key or certificate, signatures nobody here
    trusts). A signature whose key or certificate is trusted but which does not verify (a
    forged or damaged bundle, one made for other files) raises SignatureError."""
    name, version = manifest["name"], manifest["version"]
    origin = f"{name}:v{version}"
    subjects = records.version_subjects(manifest)
    good: list[Signature] = []
    unknown: list[Signature] = []
    for record in store.listed(name, version) if listed is None else listed:
        signature = Signature.from_record(record)
        bundle = store.bundle(signature.digest, signature.size)
        signer = oms.verify(bundle, subjects, origin, public_keys=public_keys,
                            certificates=certificates, remembered=remembered)
        if signer is None:
            unknown.append(signature)
            continue
        good.append(Signature.from_record({**record, "signer": signer}, verified=True))
    return good, unknown

def rehash(open_blob: Callable[[str, int], BinaryIO], manifest: Mapping[str, Any]) -> int:
    """Hash every file a version's signature covers again, as the store (or the verified
    cache) holds it now; SignatureError naming the first whose bytes are not its digest. The
    number of bytes hashed."""
    origin = f"{manifest['name']}:v{manifest['version']}"
    hashed = 0
    for f in version_files(manifest):
        try:
            with open_blob(f.digest, f.size) as fh:
                actual = sha256_file(fh)
        except DigestMismatchError as exc:
            raise SignatureError(f"{origin}: its file {f.name!r} ({f.digest}) is not the bytes "
                                 f"its signature covers ({exc})") from None
        if actual != f.digest:
            raise SignatureError(f"{origin}: its file {f.name!r} hashes to {actual}, not the "
                                 f"{f.digest} its signature covers; the stored blob was changed"
                                 ": push the same model again to repair it")
        hashed += f.size
    return hashed


def enforce(store: SignatureStore, manifest: Mapping[str, Any], mode: str, *,
            public_keys: Sequence[Path] = (), certificates: Sequence[Path] = (),
            remembered: Path | None = None) -> list[Signature]:
    """Apply the pull policy ``mode`` to a version before anything of it is loaded; returns
    the signatures that verified. ``remembered``: where passed key checks are written down
    (:func:`oms.recall`): a pull passes its cache's ``SIGNATURE_MEMOS`` folder."""
    if mode == "off":
        return []
    origin = f"{manifest['name']}:v{manifest['version']}"
    listed = store.listed(manifest["name"], manifest["version"])
    if not listed:
        if mode == "require":
            raise SignatureError(f"{origin} is not signed and REGISTRY_VERIFY=require; sign it "
                                 f"(`registry sign {origin} --key KEY.pem`) or pull with "
                                 "REGISTRY_VERIFY=if-signed")
        return []
    trusted = {oms.key_signer(k) for k in public_keys}
    if not certificates and not any(r["signer"] in trusted for r in listed):
        # Nothing here can check these (the records' signers are only a hint: a record that
        # lies loses its own verification, never passes a bundle by someone else).
        good: list[Signature] = []
        unknown = [Signature.from_record(r) for r in listed]
    else:
        good, unknown = verify(store, manifest, public_keys=public_keys,
                               certificates=certificates, listed=listed, remembered=remembered)
    if not good and mode == "require":
        signers = ", ".join(sorted({s.signer for s in unknown}))
        raise SignatureError(f"{origin} is signed only by {signers}, which REGISTRY_TRUSTED_KEYS "
                             "and REGISTRY_TRUSTED_CERTS do not trust (REGISTRY_VERIFY=require); "
                             "add the signer's public key to REGISTRY_TRUSTED_KEYS")
    # Warned only where someone configured trust: with none, every signature is unchecked.
    report = log.warning if public_keys or certificates else log.info
    for s in unknown:
        report("%s: signature by %s %s not checked: not in REGISTRY_TRUSTED_KEYS / "
                    "REGISTRY_TRUSTED_CERTS", origin, s.method, s.signer)
    return good


def directory_signature(store: SignatureStore, manifest: Mapping[str, Any]) -> bytes | None:
    """The ``model.sig`` of the directory ``save_pretrained`` writes with the stored bytes: the
    latest signature's bundle over exactly those files, so the reference ``model_signing
    verify`` passes on it. None for an unsigned version."""
    listed = [r for r in store.listed(manifest["name"], manifest["version"]) if r["pretrained"]]
    if not listed:
        return None
    extra = listed[-1]["pretrained"]
    return store.bundle(extra["digest"], extra["size"])


def write_directory_signature(store: SignatureStore, manifest: Mapping[str, Any],
                              root: Path) -> Path | None:
    """Write :func:`directory_signature` into a directory ``save_pretrained`` just wrote with
    the stored bytes; None (nothing written) for an unsigned version."""
    data = directory_signature(store, manifest)
    if data is None:
        return None
    target = root / oms.SIGNATURE_NAME
    tmp = target.with_name(f".registry-{target.name}")
    tmp.write_bytes(data)
    tmp.replace(target)
    return target
