"""What the cache remembers cannot be planted (issue 45): a signature memo is bound by an HMAC
under a per-cache secret (0600), so a memo written by someone who can write the cache (but not
read the secret) is not believed; a trusted key file rewritten in place with the same size and
mtime is read again (ctime is part of its identity); gc deletes a blob's `checked/sha256/<hex>`
marker with the blob, and markers whose blob is already gone."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

import registry
from registry.errors import SignatureError
from registry.signing import memo, oms, records
from tests.helpers import trained_mlp
from tests.keys import ec_key_pair

pytest.importorskip("model_signing")


def _signed_bundle(home: Path, work: Path) -> tuple[bytes, dict[str, str], Path]:
    key = ec_key_pair(work / "keys", "producer")
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(), "mlp", sign_key=key.private)
    record = reg.backend.signatures.listed("mlp", 1)[0]
    bundle = reg.backend.signatures.bundle(record["digest"], record["size"])
    manifest = reg.backend.resolve(registry.parse_ref("mlp:v1")).manifest
    return bundle, records.version_subjects(manifest), key.public


def _forged(bundle: bytes) -> bytes:
    """The same signer's hint, a signature over other bytes: it cannot verify."""
    data = json.loads(bundle)
    signature = bytearray(base64.b64decode(data["dsseEnvelope"]["signatures"][0]["sig"]))
    signature[-1] ^= 0x01
    data["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(signature)).decode()
    return json.dumps(data).encode()


def _check(bundle: bytes, subjects: dict[str, str], key: Path) -> memo.Check:
    return (hashlib.sha256(bundle).hexdigest(),
            hashlib.sha256(json.dumps(sorted(subjects.items())).encode()).hexdigest(),
            (oms.trusted_file(key)[0],))


def test_a_planted_signature_memo_is_not_believed(home: Path, work: Path) -> None:
    bundle, subjects, key = _signed_bundle(home, work)
    folder = home / "cache" / "signatures-test"
    signer = oms.verify(bundle, subjects, "mlp:v1", public_keys=[key], remembered=folder)
    assert signer is not None
    secret = folder / memo.SECRET_NAME
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    memo.forget()  # a new process: only what the cache holds
    assert oms.verify(bundle, subjects, "mlp:v1", public_keys=[key], remembered=folder) == signer

    forged = _forged(bundle)
    planted = memo.file_of(folder, _check(forged, subjects, key))
    for content in (signer.encode(), signer.encode() + b"\n" + b"0" * 64):
        planted.write_bytes(content)  # the memo's name is computable from public data
        memo.forget()
        with pytest.raises(SignatureError, match="does not verify|not verify"):
            oms.verify(forged, subjects, "mlp:v1", public_keys=[key], remembered=folder)
    # A secret anyone else can read binds nothing: memos are then not believed at all.
    os.chmod(secret, 0o644)
    memo.forget()
    good = memo.file_of(folder, _check(bundle, subjects, key))
    assert good.exists() and not memo.recall(good, signer)


def test_a_trusted_key_rewritten_in_place_is_read_again(work: Path) -> None:
    first = ec_key_pair(work / "a", "k")
    second = ec_key_pair(work / "b", "k")
    path = work / "trusted.pub.pem"
    path.write_bytes(first.public.read_bytes())
    before = oms.key_signer(path)
    st = path.stat()
    replacement = second.public.read_bytes()
    assert len(replacement) == st.st_size  # P-256 public keys: one PEM size
    with open(path, "r+b") as fh:  # in place: the same inode, size and (restored) mtime
        fh.write(replacement)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size,
                                                                 st.st_mtime_ns)
    assert oms.key_signer(path) == oms.key_fingerprint(replacement) != before


def test_gc_deletes_a_blobs_checked_marker_with_it(home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_GC_GRACE", "0")
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(0), "mlp")
    kept = reg.push(trained_mlp(1), "other")
    gone = reg.show("mlp:v1").metadata["files"][0]["digest"]
    markers = home / "objects" / "checked" / "sha256"
    markers.mkdir(parents=True)
    for digest in (gone, kept.metadata["files"][0]["digest"], "sha256:" + "ab" * 32):
        (markers / digest[7:]).write_text("{}")  # the last one's blob never existed
    reg.delete_version("mlp:v1", force=True)
    report = reg.gc()
    assert gone in report.deleted
    assert sorted(p.name for p in markers.iterdir()) == [kept.metadata["files"][0]["digest"][7:]]
