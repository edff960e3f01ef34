"""Hostile signatures (issue 34): truncated and forged bundles, another key's signature, a
signature copied from another version, subjects omitting or adding a file, a 100 MB bundle and
a certificate chain that does not reach the trusted root. Each is a typed error (SignatureError
or ManifestError), never a load, never a 5xx; none is read whole when oversized."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import registry
from registry.errors import RegistryError, SignatureError
from registry.io.digests import sha256_bytes
from registry.signing import oms, records
from tests.helpers import trained_mlp
from tests.integration.serving import Service
from tests.keys import KeyPair, cert_chain, ec_key_pair

pytest.importorskip("model_signing")


@pytest.fixture
def producer(work: Path) -> KeyPair:
    return ec_key_pair(work / "keys", "producer")


@pytest.fixture
def signed(home: Path, producer: KeyPair, monkeypatch: pytest.MonkeyPatch) -> registry.Registry:
    """mlp:v1 and mlp:v2, each signed by ``producer``; pulls trust only ``producer``."""
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(producer.public))
    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(0), "mlp", sign_key=producer.private)
    reg.push(trained_mlp(1), "mlp", sign_key=producer.private)
    return reg


def _list_file(home: Path, version: int) -> Path:
    return home / "objects" / records.store_key("mlp", version)


def _records(home: Path, version: int) -> list[dict[str, Any]]:
    return list(json.loads(_list_file(home, version).read_text())["signatures"])


def _replace_bundle(home: Path, version: int, bundle: bytes) -> None:
    """Store ``bundle`` as if it were version ``version``'s only signature."""
    (home / "objects" / "blobs" / "sha256" / sha256_bytes(bundle)[7:]).write_bytes(bundle)
    record = {**_records(home, version)[0], "digest": sha256_bytes(bundle), "size": len(bundle),
              "pretrained": None}
    _list_file(home, version).write_text(json.dumps(
        {"name": "mlp", "version": version, "signatures": [record]}))


def _bundle(home: Path, version: int) -> bytes:
    digest = _records(home, version)[0]["digest"]
    return (home / "objects" / "blobs" / "sha256" / digest[7:]).read_bytes()


def _manifest(reg: registry.Registry, version: int) -> dict[str, Any]:
    return reg.backend.resolve(registry.parse_ref(f"mlp:v{version}")).manifest


def _pull_refused(reg: registry.Registry, match: str) -> None:
    target = trained_mlp(7)
    before = target.fc1.weight.clone()
    with pytest.raises(SignatureError, match=match):
        reg.pull("mlp:v2", model=target, device="cpu")
    assert target.fc1.weight.equal(before)  # nothing reached the module


def _payload_edit(bundle: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    data = json.loads(bundle)
    payload = json.loads(base64.b64decode(data["dsseEnvelope"]["payload"]))
    edit(payload)
    data["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    return json.dumps(data).encode()


def test_truncated_bundle(signed: registry.Registry, home: Path) -> None:
    _replace_bundle(home, 2, _bundle(home, 2)[:300])
    _pull_refused(signed, "is not an OMS")


def test_bundle_whose_stored_bytes_changed(signed: registry.Registry, home: Path) -> None:
    digest = _records(home, 2)[0]["digest"]
    blob = home / "objects" / "blobs" / "sha256" / digest[7:]
    blob.write_bytes(blob.read_bytes()[:-10] + b" " * 10)
    _pull_refused(signed, "does not hash to its digest")


def test_forged_payload_keeps_the_old_signature_bytes(signed: registry.Registry,
                                                      home: Path) -> None:
    def retarget(payload: dict[str, Any]) -> None:
        payload["predicate"]["resources"][0]["digest"] = "0" * 64

    _replace_bundle(home, 2, _payload_edit(_bundle(home, 2), retarget))
    _pull_refused(signed, "by key sha256:.* does not verify")


def test_signature_by_another_key(signed: registry.Registry, home: Path, work: Path) -> None:
    stranger = ec_key_pair(work / "keys", "stranger")
    signed.sign("mlp:v2", key=stranger.private)
    # The producer's signature is still there and verifies: the stranger's is skipped.
    signed.pull("mlp:v2", model=trained_mlp(7), device="cpu")
    _replace_bundle(home, 2, _bundle(home, 2))  # keep only the first (producer) record
    listed = _records(home, 2)
    stranger_bundle = oms.sign(records.version_subjects(_manifest(signed, 2)),
                               "x", key=stranger.private)
    _replace_bundle(home, 2, stranger_bundle)
    _pull_refused(signed, "signed only by")
    # The stranger's bundle claiming the producer's key (its hint rewritten) is a forgery.
    claimed = json.loads(stranger_bundle)
    claimed["verificationMaterial"]["publicKey"]["hint"] = listed[0]["signer"][7:]
    _replace_bundle(home, 2, json.dumps(claimed).encode())
    _pull_refused(signed, "does not verify")


def test_signature_copied_from_another_version(signed: registry.Registry, home: Path) -> None:
    _list_file(home, 2).write_text(json.dumps(
        {"name": "mlp", "version": 2, "signatures": _records(home, 1)}))
    _pull_refused(signed, r"Hash mismatch for \.registry/manifest\.json")


@pytest.mark.parametrize("change", ["omit", "add"])
def test_subjects_that_omit_or_add_a_file(signed: registry.Registry, home: Path,
                                          producer: KeyPair, change: str) -> None:
    subjects = records.version_subjects(_manifest(signed, 2))
    if change == "omit":
        subjects.pop("model.safetensors")
    else:
        subjects["extra.bin"] = "1" * 64
    _replace_bundle(home, 2, oms.sign(subjects, "mlp", key=producer.private))
    _pull_refused(signed, "does not cover: model.safetensors" if change == "omit"
                  else "lists that are not there: extra.bin")


def test_a_100_mb_bundle_is_refused_without_being_read(signed: registry.Registry,
                                                       home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    big = 100 * 2**20
    record = _records(home, 2)[0]
    blob = home / "objects" / "blobs" / "sha256" / record["digest"][7:]
    with open(blob, "r+b") as fh:
        fh.truncate(big)
    _list_file(home, 2).write_text(json.dumps(
        {"name": "mlp", "version": 2, "signatures": [{**record, "size": big}]}))
    from registry.errors import ManifestError

    with pytest.raises(ManifestError, match="invalid size"):
        signed.pull("mlp:v2", model=trained_mlp(7), device="cpu")
    _list_file(home, 2).write_text(json.dumps(
        {"name": "mlp", "version": 2, "signatures": [record]}))
    reads: list[str] = []
    store = signed.backend.signatures.store  # type: ignore[attr-defined]
    real = store.get_bytes
    monkeypatch.setattr(store, "get_bytes", lambda key: reads.append(key) or real(key))
    _pull_refused(signed, "holds 104857600 bytes")
    assert not any(record["digest"][7:] in key for key in reads)


def test_a_100_mb_model_sig_in_a_pushed_directory(home: Path, work: Path) -> None:
    import torch

    src = work / "src"
    src.mkdir()
    torch.save(trained_mlp().state_dict(), src / "model.pt")
    with open(src / "model.sig", "wb") as fh:
        fh.truncate(100 * 2**20)
    with pytest.raises(SignatureError, match="over the 1048576-byte limit"):
        registry.Registry(home=home).push(src, "dir")


def test_certificate_chain_not_reaching_the_trusted_root(home: Path, work: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    corp = cert_chain(work / "pki", "corp")
    rogue = cert_chain(work / "pki", "rogue")
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(0), "mlp")
    reg.push(trained_mlp(1), "mlp")
    reg.sign("mlp:v2", key=rogue.key, certificate=rogue.leaf, chain=[rogue.root])
    monkeypatch.setenv("REGISTRY_TRUSTED_CERTS", str(corp.root))
    _pull_refused(registry.Registry(home=home), "does not reach REGISTRY_TRUSTED_CERTS")
    # A leaf of the rogue CA presented with the trusted root as its "chain" does not chain.
    reg.sign("mlp:v1", key=rogue.key, certificate=rogue.leaf, chain=[corp.root])
    with pytest.raises(SignatureError):
        registry.Registry(home=home).verify("mlp:v1")


@pytest.mark.parametrize("body", [
    {"record": {}, "bundles": {}},
    {"record": {"digest": "sha256:" + "0" * 64, "size": 10, "method": "key", "signer": "x",
                "created_at": "now", "pretrained": None}, "bundles": {}},
    {"record": {"digest": "sha256:" + "0" * 64, "size": 10, "method": "key", "signer": "x",
                "created_at": "now", "pretrained": None},
     "bundles": {"sha256:" + "0" * 64: "not base64!"}},
    {"record": {"digest": "sha256:" + "0" * 64, "size": 9, "method": "key", "signer": "x",
                "created_at": "now", "pretrained": None},
     "bundles": {"sha256:" + "0" * 64: base64.b64encode(b"not json!").decode()}},
    {"record": [], "bundles": []},
])
def test_server_refuses_malformed_signatures_with_4xx(server: Service,
                                                      body: dict[str, Any]) -> None:
    answer = httpx.post(f"{server.url}/api/v1/models/seeded/versions/1/signatures", json=body)
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]["code"] in ("invalid_request", "invalid_manifest",
                                              "signature_invalid")
    huge = httpx.post(f"{server.url}/api/v1/models/seeded/versions/1/signatures",
                      content=b"{" + b" " * (2 * 2**20) + b"}",
                      headers={"Content-Type": "application/json"})
    assert huge.status_code == 413


def test_errors_are_registry_errors() -> None:
    assert issubclass(SignatureError, RegistryError) and SignatureError.code == \
        "signature_invalid"
