"""Signatures through a registry server (issue 34): the wire format, and a server that demands
signatures from trusted keys on commit (REGISTRY_REQUIRE_SIGNED), so a write token alone cannot
publish an unsigned version. A real `registry serve` subprocess on loopback."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import registry
from registry.errors import SignatureError
from registry.signing import service
from registry.signing.remote import wire
from tests.helpers import trained_mlp
from tests.integration.serving import registry_server
from tests.keys import ec_key_pair

pytest.importorskip("model_signing")


def test_signatures_travel_through_the_server(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    producer = ec_key_pair(tmp_path / "keys", "producer")
    reviewer = ec_key_pair(tmp_path / "keys", "reviewer")
    with registry_server(tmp_path / "server-home", tmp_path) as server:
        client = registry.Registry(server.url, home=tmp_path / "client")
        mv = client.push(trained_mlp(), "mlp", sign_key=producer.private)
        assert len(mv.metadata["signatures"]) == 1  # sent with the commit
        client.sign("mlp", key=reviewer.private)
        listed = httpx.get(f"{server.url}/api/v1/models/mlp/versions/1/signatures").json()
        assert {s["method"] for s in listed["signatures"]} == {"key"}
        assert len(listed["signatures"]) == 2
        good = client.verify("mlp", public_keys=[producer.public, reviewer.public])
        assert len(good) == 2
        monkeypatch.setenv("REGISTRY_VERIFY", "require")
        monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(reviewer.public))
        puller = registry.Registry(server.url, home=tmp_path / "puller")
        puller.pull("mlp", model=trained_mlp(1), device="cpu")
        monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(tmp_path / "keys" / "producer.pub.pem"))
        stranger = ec_key_pair(tmp_path / "keys", "stranger")
        monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(stranger.public))
        with pytest.raises(SignatureError, match="signed only by"):
            registry.Registry(server.url, home=tmp_path / "puller2").pull(
                "mlp", model=trained_mlp(1), device="cpu")


def test_a_server_requiring_signatures_refuses_unsigned_and_untrusted_commits(
        tmp_path: Path) -> None:
    producer = ec_key_pair(tmp_path / "keys", "producer")
    stranger = ec_key_pair(tmp_path / "keys", "stranger")
    env = {"REGISTRY_REQUIRE_SIGNED": "true", "REGISTRY_TRUSTED_KEYS": str(producer.public)}
    with registry_server(tmp_path / "server-home", tmp_path, env_extra=env) as server:
        client = registry.Registry(server.url, home=tmp_path / "client")
        with pytest.raises(SignatureError, match="carries no signature"):
            client.push(trained_mlp(), "mlp")
        with pytest.raises(SignatureError, match="does not trust"):
            client.push(trained_mlp(), "mlp", sign_key=stranger.private)
        # A signature that does not cover exactly the version's files: made for another
        # version number (a copied signature), and for one file less.
        for forge in (lambda m: {**m, "version": m["version"] + 1},
                      lambda m: {**m, "attachments": []} if "attachments" in m
                      else {**m, "files": m["files"][:-1]}):
            client.backend.signatures.commit_signer = (
                lambda m, forge=forge: wire(*service.make(forge(m), key=producer.private)))
            with pytest.raises(SignatureError, match="does not verify"):
                client.push(trained_mlp(), "mlp", shard_size=600)
        client.backend.signatures.commit_signer = None
        with pytest.raises(registry.NotFoundError):
            client.show("mlp")  # nothing was published
        mv = client.push(trained_mlp(), "mlp", sign_key=producer.private)
        assert mv.metadata["signatures"][0]["signer"].startswith("sha256:")
        answer = httpx.post(f"{server.url}/api/v1/models/mlp/pushes/1/commit",
                            json={"manifest": {}, "signature": {"record": {}, "bundles": {}}})
        assert 400 <= answer.status_code < 500
