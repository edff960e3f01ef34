"""Signatures vouch for bytes, not only digests (issue 45): `registry verify` hashes every file a
signature covers again and fails (exit 13, naming the file) on a stored byte flipped after the
push, `--fast` keeps the digest-only check and says so; under the default
REGISTRY_VERIFY=if-signed, a pushed directory whose trusted signature no longer verifies is
refused, and an unknown signer's is kept and shown as unverified."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import registry
from registry.errors import SignatureError
from tests.helpers import clean_env, run_cli, trained_mlp
from tests.integration.test_signing_interop import _pretrained_dir, model_signing
from tests.keys import KeyPair, ec_key_pair

pytest.importorskip("model_signing")


@pytest.fixture
def producer(work: Path) -> KeyPair:
    return ec_key_pair(work / "keys", "producer")


def _flip_a_stored_byte(home: Path, digest: str) -> Path:
    blob = home / "objects" / "blobs" / "sha256" / digest[7:]
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    return blob


def test_verify_rehashes_the_stored_bytes(home: Path, producer: KeyPair,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(producer.public))
    reg = registry.Registry(home=home)
    mv = reg.push(trained_mlp(), "mlp", sign_key=producer.private)
    assert [s.verified for s in reg.verify("mlp:v1")] == [True]  # intact: verifies
    shard = mv.metadata["files"][0]["digest"]
    _flip_a_stored_byte(home, shard)
    with pytest.raises(SignatureError, match=shard):
        registry.Registry(home=home).verify("mlp:v1")
    assert len(registry.Registry(home=home).verify("mlp:v1", fast=True)) == 1  # digests only

    env = clean_env(home)
    refused = run_cli("verify", "mlp:v1", "--key", str(producer.public), env=env)
    assert refused.returncode == 13, refused.stdout + refused.stderr
    assert shard in refused.stderr
    fast = run_cli("verify", "mlp:v1", "--key", str(producer.public), "--fast", env=env)
    assert fast.returncode == 0 and "digests only (--fast)" in fast.stdout


def test_if_signed_refuses_a_trusted_directory_signature_that_fails(
        work: Path, home: Path, producer: KeyPair, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _pretrained_dir(work / "src")
    signed = model_signing("sign", "key", str(src), "--private_key", str(producer.private),
                           "--signature", str(src / "model.sig"))
    assert signed.returncode == 0, signed.stdout + signed.stderr
    (src / "README.md").write_text("# changed after signing\n")
    monkeypatch.delenv("REGISTRY_VERIFY", raising=False)  # the default: if-signed
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(producer.public))
    reg = registry.Registry(home=home)
    with pytest.raises(SignatureError, match="README.md"):
        reg.push(src, "gpt2")
    assert reg.list_models() == []
    # Nobody here trusts the signer: kept, shown as unverified.
    stranger = ec_key_pair(work / "keys", "stranger")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(stranger.public))
    mv = registry.Registry(home=home).push(src, "gpt2")
    listed = registry.Registry(home=home).show(mv.ref).metadata["signatures"]
    assert [s["status"] for s in listed] == ["unverified: signer not trusted"]
    shown = run_cli("show", mv.ref, env=clean_env(home), check=True).stdout
    assert "unverified: signer not trusted" in shown
    shutil.rmtree(src)
