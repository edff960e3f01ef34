"""Signed versions (issue 34): OMS bundles made on push or later, listed, verified with trusted
keys or a CA, enforced on pull by REGISTRY_VERIFY, kept by gc and restored by `db rebuild`.
Keys and certificates are generated in the tests (tests/keys.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import registry
from registry.errors import SettingsError, SignatureError
from registry.settings import Settings
from registry.signing import records
from tests.helpers import clean_env, run_cli, trained_mlp
from tests.keys import KeyPair, cert_chain, ec_key_pair

pytest.importorskip("model_signing")


@pytest.fixture
def keys(tmp_path: Path) -> tuple[KeyPair, KeyPair]:
    return ec_key_pair(tmp_path / "keys", "producer"), ec_key_pair(tmp_path / "keys", "reviewer")


def _fingerprint(pair: KeyPair) -> str:
    from registry.signing.oms import key_fingerprint

    return key_fingerprint(pair.public.read_bytes())


def _store_file(home: Path, name: str, version: int) -> Path:
    return home / "objects" / records.store_key(name, version)


def _copy_signatures(home: Path, name: str, source: int, target: int) -> None:
    """Make the store's record list of ``name:v<target>`` point at ``v<source>``'s bundles."""
    copied = json.loads(_store_file(home, name, source).read_text())["signatures"]
    listed = json.loads(_store_file(home, name, target).read_text())
    listed["signatures"] = copied
    _store_file(home, name, target).write_text(json.dumps(listed))


def test_push_signs_and_show_lists_signer_method_and_time(reg: registry.Registry,
                                                         keys: tuple[KeyPair, KeyPair]) -> None:
    producer, _ = keys
    mv = reg.push(trained_mlp(), "mlp", sign_key=producer.private)
    shown = reg.show(mv.ref).metadata["signatures"]
    assert len(shown) == 1
    assert shown[0]["method"] == "key"
    assert shown[0]["signer"] == _fingerprint(producer)
    assert shown[0]["created_at"].startswith("20")
    # The bundle is a version file of role "signature", stored content-addressed.
    digest = shown[0]["digest"]
    assert (reg.settings.home / "objects" / "blobs" / "sha256" / digest[7:]).is_file()
    assert reg.verify(mv.ref, public_keys=[producer.public])[0].verified


def test_several_signatures_each_verify_with_their_own_key(
        reg: registry.Registry, keys: tuple[KeyPair, KeyPair]) -> None:
    producer, reviewer = keys
    reg.push(trained_mlp(), "mlp", sign_key=producer.private)
    reg.sign("mlp:v1", key=reviewer.private)
    assert len(reg.show("mlp").metadata["signatures"]) == 2
    both = reg.verify("mlp", public_keys=[producer.public, reviewer.public])
    assert {s.signer for s in both} == {_fingerprint(producer), _fingerprint(reviewer)}
    only = reg.verify("mlp", public_keys=[reviewer.public])
    assert [s.signer for s in only] == [_fingerprint(reviewer)]
    stranger = ec_key_pair(reg.settings.home.parent / "keys", "stranger")
    assert reg.verify("mlp", public_keys=[stranger.public]) == []


def test_signature_survives_tag_changes(reg: registry.Registry,
                                        keys: tuple[KeyPair, KeyPair]) -> None:
    producer, _ = keys
    reg.push(trained_mlp(), "mlp", sign_key=producer.private, tags={"stage": "dev"})
    reg.set_tags("mlp:v1", {"stage": "prod"})
    assert len(reg.verify("mlp:v1", public_keys=[producer.public])) == 1


def test_signature_covers_every_file_and_the_manifest(reg: registry.Registry,
                                                      keys: tuple[KeyPair, KeyPair],
                                                      tmp_path: Path) -> None:
    producer, _ = keys
    card = tmp_path / "README.md"
    card.write_text("a card")
    mv = reg.push(trained_mlp(), "mlp", sign_key=producer.private, files={"README.md": card},
                  shard_size=600)
    subjects = records.version_subjects(reg.show(mv.ref).metadata)
    shards = [n for n in subjects if n.endswith(".safetensors")]
    assert len(shards) >= 2
    assert set(subjects) == {*shards, "README.md", records.MANIFEST_SUBJECT}


def test_require_refuses_unsigned_and_untrusted_before_any_tensor_is_loaded(
        reg: registry.Registry, keys: tuple[KeyPair, KeyPair],
        monkeypatch: pytest.MonkeyPatch) -> None:
    producer, reviewer = keys
    reg.push(trained_mlp(0), "plain")
    reg.push(trained_mlp(0), "signed", sign_key=producer.private)
    target = trained_mlp(1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(reviewer.public))
    strict = registry.Registry()
    with pytest.raises(SignatureError, match="plain:v1 is not signed"):
        strict.pull("plain", model=target, device="cpu")
    with pytest.raises(SignatureError, match=f"signed only by {_fingerprint(producer)}"):
        strict.pull("signed", model=target, device="cpu")
    with pytest.raises(SignatureError):
        strict.pull_state_dict("signed", device="cpu")
    for k, v in target.state_dict().items():  # nothing reached the module
        assert torch.equal(v, before[k])
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", f"{reviewer.public}:{producer.public}")
    loaded = registry.Registry().pull("signed", model=trained_mlp(1), device="cpu")
    assert torch.equal(loaded.fc1.weight, trained_mlp(0).fc1.weight)


def test_a_trusted_signature_that_does_not_verify_is_an_error_in_every_mode_but_off(
        reg: registry.Registry, keys: tuple[KeyPair, KeyPair], home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    producer, _ = keys
    reg.push(trained_mlp(0), "mlp", sign_key=producer.private)
    reg.push(trained_mlp(1), "mlp", sign_key=producer.private)
    _copy_signatures(home, "mlp", 1, 2)  # a signature copied from another version
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(producer.public))
    for mode in ("if-signed", "require"):
        monkeypatch.setenv("REGISTRY_VERIFY", mode)
        with pytest.raises(SignatureError, match=r"mlp:v2 by key .* does not verify.*"
                                                 r"Hash mismatch"):
            registry.Registry().pull("mlp:v2", device="cpu", model=trained_mlp(3))
    monkeypatch.setenv("REGISTRY_VERIFY", "off")
    registry.Registry().pull("mlp:v2", device="cpu", model=trained_mlp(3))
    monkeypatch.setenv("REGISTRY_VERIFY", "if-signed")
    registry.Registry().pull("mlp:v1", device="cpu", model=trained_mlp(3))


def test_a_passed_key_check_is_written_down_and_vouches_for_that_check_only(
        reg: registry.Registry, keys: tuple[KeyPair, KeyPair], home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.signing import oms

    producer, reviewer = keys
    reg.push(trained_mlp(0), "mlp", sign_key=producer.private)
    reg.push(trained_mlp(1), "mlp", sign_key=producer.private)
    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(producer.public))
    oms.forget_verified()
    registry.Registry().pull("mlp:v1", device="cpu", model=trained_mlp(3))
    memos = [m for m in (home / "cache" / "signatures").iterdir() if m.name != ".secret"]
    # The signer, then the HMAC that binds it to this memo under the cache's secret.
    assert [m.read_text().split("\n")[0] for m in memos] == [_fingerprint(producer)]

    checks: list[str] = []
    real_check = oms._verify

    def counted(bundle: bytes, found: oms.BundleFacts, *args: object) -> str | None:
        checks.append(found.signer)
        return real_check(bundle, found, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(oms, "_verify", counted)
    oms.forget_verified()  # as a new process: the written-down check answers
    loaded = registry.Registry().pull("mlp:v1", device="cpu", model=trained_mlp(3))
    assert torch.equal(loaded.fc1.weight, trained_mlp(0).fc1.weight)
    assert checks == []
    # v2's own signature: another bundle and other subjects, so checked.
    registry.Registry().pull("mlp:v2", device="cpu", model=trained_mlp(3))
    assert checks == [_fingerprint(producer)]

    # Trust taken away: the memo names a key no longer trusted, so it vouches for nothing.
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(reviewer.public))
    oms.forget_verified()
    with pytest.raises(SignatureError, match="signed only by"):
        registry.Registry().pull("mlp:v1", device="cpu", model=trained_mlp(3))

    # A memo naming another signer than the bundle's is not believed: the check runs again.
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", f"{producer.public}:{reviewer.public}")
    for memo in (home / "cache" / "signatures").iterdir():
        if memo.name != ".secret":  # the memos, not the secret that binds them
            memo.write_text(_fingerprint(reviewer))
    oms.forget_verified()
    checks.clear()
    registry.Registry().pull("mlp:v1", device="cpu", model=trained_mlp(3))
    assert checks == [_fingerprint(producer)]

    # v1's bundle copied onto v2: other subjects, so v1's memo does not apply and it fails.
    _copy_signatures(home, "mlp", 1, 2)
    oms.forget_verified()
    with pytest.raises(SignatureError, match="Hash mismatch"):
        registry.Registry().pull("mlp:v2", device="cpu", model=trained_mlp(3))


def test_certificate_signing_verifies_to_the_trusted_root_only(
        reg: registry.Registry, tmp_path: Path) -> None:
    chain = cert_chain(tmp_path / "pki", "corp", identity="release@corp.example")
    other = cert_chain(tmp_path / "pki", "other")
    reg.push(trained_mlp(), "mlp")
    signed = reg.sign("mlp", key=chain.key, certificate=chain.leaf, chain=[chain.root])
    assert (signed.method, signed.signer) == ("certificate", "release@corp.example")
    assert [s.signer for s in reg.verify("mlp", certificates=[chain.root])] == \
        ["release@corp.example"]
    with pytest.raises(SignatureError, match="does not reach REGISTRY_TRUSTED_CERTS"):
        reg.verify("mlp", certificates=[other.root])
    with pytest.raises(SignatureError, match="needs its chain"):
        reg.sign("mlp", key=chain.key, certificate=chain.leaf)


def test_rebuild_restores_signatures_and_gc_keeps_their_bundles(
        reg: registry.Registry, keys: tuple[KeyPair, KeyPair], home: Path) -> None:
    producer, reviewer = keys
    reg.push(trained_mlp(), "mlp", sign_key=producer.private)
    reg.sign("mlp", key=reviewer.private)
    reg.gc()
    assert len(reg.verify("mlp", public_keys=[producer.public, reviewer.public])) == 2
    reg.close()
    (home / "registry.db").unlink()
    rebuilt = registry.Registry(home=home)
    assert rebuilt.backend.rebuild() == 1
    rebuilt.gc()
    assert len(rebuilt.verify("mlp", public_keys=[producer.public, reviewer.public])) == 2
    # A deleted version's signatures are not restored (its number is never reused).
    rebuilt.delete_version("mlp:v1")
    assert rebuilt.backend.rebuild() == 0


def test_settings_parse_strictly(tmp_path: Path, keys: tuple[KeyPair, KeyPair]) -> None:
    assert Settings.from_env({}).verify == "if-signed"
    assert Settings.from_env({"REGISTRY_VERIFY": "Require"}).verify == "require"
    with pytest.raises(SettingsError, match="REGISTRY_VERIFY='sometimes'"):
        Settings.from_env({"REGISTRY_VERIFY": "sometimes"})
    with pytest.raises(SettingsError, match="REGISTRY_TRUSTED_KEYS names"):
        Settings.from_env({"REGISTRY_TRUSTED_KEYS": str(tmp_path / "missing.pem")})
    both = f"{keys[0].public}:{keys[1].public}"
    assert len(Settings.from_env({"REGISTRY_TRUSTED_KEYS": both}).trusted_keys) == 2


def test_sign_with_a_key_that_is_not_an_ec_key_is_a_typed_error(
        reg: registry.Registry, tmp_path: Path) -> None:
    reg.push(trained_mlp(), "mlp")
    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(SignatureError, match="cannot sign with"):
        reg.sign("mlp", key=bad)


def test_cli_push_sign_show_verify(home: Path, tmp_path: Path,
                                   keys: tuple[KeyPair, KeyPair]) -> None:
    producer, reviewer = keys
    ckpt = tmp_path / "m.pt"
    torch.save(trained_mlp().state_dict(), ckpt)
    env = clean_env(home)
    out = run_cli("push", "mlp", str(ckpt), "--sign-key", str(producer.private), env=env,
                  check=True)
    assert "(signed)" in out.stdout
    run_cli("sign", "mlp:v1", "--key", str(reviewer.private), env=env, check=True)
    shown = run_cli("show", "mlp", env=env, check=True).stdout
    assert _fingerprint(producer) in shown and _fingerprint(reviewer) in shown
    ok = run_cli("verify", "mlp", "--key", str(producer.public), env=env, check=True)
    assert f"verified mlp:v1: key {_fingerprint(producer)}" in ok.stdout
    stranger = ec_key_pair(tmp_path / "keys", "stranger")
    refused = run_cli("verify", "mlp", "--key", str(stranger.public), env=env)
    assert refused.returncode == 13 and "no signature of mlp:v1 verifies" in refused.stderr
    pulled = run_cli("pull", "mlp", "-o", str(tmp_path / "o.safetensors"),
                     env={**env, "REGISTRY_VERIFY": "require",
                          "REGISTRY_TRUSTED_KEYS": str(stranger.public)})
    assert pulled.returncode == 13 and "signed only by" in pulled.stderr


def test_mlflow_mirror_tags_the_signers(reg: registry.Registry, keys: tuple[KeyPair, KeyPair],
                                        tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    from registry.mirror.mirror_mlflow import sync

    producer, reviewer = keys
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    reg.push(trained_mlp(), "mlp", sign_key=producer.private)
    assert sync(reg.backend, uri).mirrored == ["mlp:v1"]  # type: ignore[arg-type]
    tags = MlflowClient(tracking_uri=uri).get_model_version("mlp", "1").tags
    assert tags["registry.signatures"] == f"key {_fingerprint(producer)}"
    reg.sign("mlp", key=reviewer.private)  # a new signature re-mirrors the version
    assert sync(reg.backend, uri).mirrored == ["mlp:v1"]  # type: ignore[arg-type]
    tags = MlflowClient(tracking_uri=uri).get_model_version("mlp", "1").tags
    assert _fingerprint(reviewer) in tags["registry.signatures"]


@pytest.mark.parametrize("catalog", ["sqlite", "postgresql"])
def test_concurrent_signers_of_one_version_each_keep_their_record(
        catalog: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    """Each signer read the store's list, appended its record and wrote the list back with no
    lock: two at once, and the later write dropped the other's record from the store (the
    catalog kept the bundle rows, so `show` and `db rebuild` lost a signature). The list
    write is slowed down here so the signers overlap every time."""
    import threading
    import time

    url = request.getfixturevalue("pg_url") if catalog == "postgresql" else None

    def opened() -> registry.Registry:
        return registry.Registry(home=tmp_path / "home", catalog=url)

    signers = [ec_key_pair(tmp_path / "many", f"signer{i}") for i in range(4)]
    opened().push(trained_mlp(), "mlp")
    real = records.dumps

    def slow_dumps(*args: object, **kwargs: object) -> bytes:
        time.sleep(0.3)  # between the read of the list and its write
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(records, "dumps", slow_dumps)
    start, errors = threading.Barrier(len(signers)), []

    def sign(pair: KeyPair) -> None:
        other = opened()
        try:
            start.wait()
            other.sign("mlp:v1", key=pair.private)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
        finally:
            other.close()

    threads = [threading.Thread(target=sign, args=(pair,)) for pair in signers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    fresh = opened()
    assert len(fresh.show("mlp:v1").metadata["signatures"]) == len(signers)
    found = fresh.verify("mlp:v1", public_keys=[p.public for p in signers])
    assert {s.signer for s in found} == {_fingerprint(p) for p in signers}
    fresh.close()
