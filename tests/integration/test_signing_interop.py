"""Interoperability with the reference OpenSSF Model Signing tools, both ways (issue 34).

The `model_signing` command of the reference package (not our code) runs as a subprocess:
it verifies the directories the registry writes for a signed version (``save_pretrained`` and
``registry pull --format hf``), and it signs a directory that is then pushed, verified at push,
kept as ``provenance/model.sig`` and recorded in the version's ``source``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import registry
from registry.errors import SignatureError
from tests.helpers import clean_env, run_cli
from tests.keys import KeyPair, ec_key_pair

pytest.importorskip("model_signing")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def model_signing(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("model_signing")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "model_signing"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=300)


def reference_verify(directory: Path, key: KeyPair) -> subprocess.CompletedProcess[str]:
    return model_signing("verify", "key", str(directory), "--signature",
                         str(directory / "model.sig"), "--public_key", str(key.public))


def _pretrained_dir(directory: Path, *, shards: bool = False) -> Path:
    import torch

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64))
    model.save_pretrained(directory, max_shard_size="40KB" if shards else "5GB")
    (directory / "README.md").write_text("# tiny gpt2\n")
    return directory


@pytest.mark.parametrize("shards", [False, True], ids=["one-file", "sharded"])
def test_written_directories_verify_with_the_reference_cli(tmp_path: Path, shards: bool) -> None:
    key = ec_key_pair(tmp_path / "keys")
    reg = registry.Registry(home=tmp_path / "home")
    mv = reg.push(_pretrained_dir(tmp_path / "src", shards=shards), "gpt2",
                  sign_key=key.private, shard_size=40_000 if shards else None)
    out = reg.save_pretrained(mv.ref, tmp_path / "out")
    assert (out / "model.sig").is_file()
    if shards:
        assert (out / "model.safetensors.index.json").is_file()
    result = reference_verify(out, key)
    assert result.returncode == 0, result.stdout + result.stderr
    # The reference tool checks what we wrote, not our word for it.
    (out / "README.md").write_text("# changed\n")
    refused = reference_verify(out, key)
    assert refused.returncode != 0 and "README.md" in refused.stdout + refused.stderr

    cli_out = tmp_path / "cli-out"
    run_cli("pull", "gpt2", "--format", "hf", "-o", str(cli_out),
            env=clean_env(tmp_path / "home"), check=True)
    result = reference_verify(cli_out, key)
    assert result.returncode == 0, result.stdout + result.stderr
    # A cast copy is not the signed bytes: no model.sig is written for it.
    cast = reg.save_pretrained(mv.ref, tmp_path / "cast", dtype="float16")
    assert not (cast / "model.sig").exists()


def test_a_directory_signed_by_the_reference_cli_is_verified_at_push(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = ec_key_pair(tmp_path / "keys", "producer")
    stranger = ec_key_pair(tmp_path / "keys", "stranger")
    src = _pretrained_dir(tmp_path / "src")
    signed = model_signing("sign", "key", str(src), "--private_key", str(key.private),
                           "--signature", str(src / "model.sig"))
    assert signed.returncode == 0, signed.stdout + signed.stderr
    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(key.public))
    reg = registry.Registry(home=tmp_path / "home")
    mv = reg.push(src, "gpt2")
    fact = mv.metadata["source"]["signed_files"]
    assert fact["verified"] is True and fact["method"] == "key"
    from registry.signing.oms import key_fingerprint

    assert fact["signer"] == key_fingerprint(key.public.read_bytes())
    names = {a["name"] for a in mv.metadata["attachments"]}
    assert "provenance/model.sig" in names and "model.sig" not in names
    # The version itself is unsigned (its files are normalized ones): `require` refuses it
    # until someone signs it; its provenance file travels with it.
    with pytest.raises(SignatureError, match="is not signed"):
        reg.pull_files(mv.ref, tmp_path / "files")
    reg.sign(mv.ref, key=key.private)
    files = reg.pull_files(mv.ref, tmp_path / "files")
    assert (files / "provenance" / "model.sig").read_bytes() == (src / "model.sig").read_bytes()

    # A file changed after signing by a trusted key: refused under require and if-signed alike
    # (issue 45); pushed only with checks off.
    tampered = tmp_path / "tampered"
    shutil.copytree(src, tampered)
    (tampered / "README.md").write_text("# changed after signing\n")
    with pytest.raises(SignatureError, match="README.md"):
        reg.push(tampered, "gpt2")
    monkeypatch.setenv("REGISTRY_VERIFY", "if-signed")
    with pytest.raises(SignatureError, match="README.md"):
        registry.Registry(home=tmp_path / "home").push(tampered, "gpt2")
    # By a signer nobody here trusts: kept, and listed as unverified, never silently.
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(stranger.public))
    kept = registry.Registry(home=tmp_path / "home").push(tampered, "gpt2")
    assert kept.metadata["source"]["signed_files"]["verified"] is False
    shown = registry.Registry(home=tmp_path / "home").show(kept.ref).metadata["signatures"]
    assert [(s["file"], s["status"]) for s in shown] == [
        ("provenance/model.sig", "unverified: signer not trusted")]
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(key.public))
    # A signer nobody trusts is refused under require too.
    monkeypatch.setenv("REGISTRY_VERIFY", "require")
    monkeypatch.setenv("REGISTRY_TRUSTED_KEYS", str(stranger.public))
    with pytest.raises(SignatureError, match="do not trust"):
        registry.Registry(home=tmp_path / "home").push(src, "gpt2")
