"""A re-push compares the shards it shares with the previous version against their verified local
copies instead of writing and hashing them again (registry/caching/unchanged.py); a copy that is not
verified, or whose bytes differ, never lends its digest."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from registry import Registry
from registry import manifest as mf
from registry.backends import LocalBackend
from registry.io import weights
from registry.io.digests import sha256_file
from tests.helpers import assert_same_state, block_lm
from tests.integration.conftest import CuttingProxy

SHARD = "16KiB"


def _fine_tune(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        model.layers[-1].mlp.weight.add_(0.5)
    return model


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every safetensors file a push writes (and hashes), by path."""
    written: list[Path] = []
    real = weights.write_safetensors

    def spy(tensors: Any, path: Any, *args: Any, **kwargs: Any) -> tuple[str, int]:
        written.append(Path(path))
        return real(tensors, path, *args, **kwargs)

    monkeypatch.setattr(weights, "write_safetensors", spy)
    return written


def _blob(reg: Registry, digest: str) -> Path:
    return reg.settings.home / "objects" / mf.blob_key(digest)


def _digests(mv: Any) -> list[str]:
    return [f["digest"] for f in mv.metadata["files"]]


def test_a_fine_tune_writes_only_its_changed_shard(reg: Registry,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    v1 = reg.push(block_lm(), "lm", shard_size=SHARD)
    written = _count_writes(monkeypatch)
    tuned = _fine_tune(block_lm())
    v2 = reg.push(tuned, "lm", shard_size=SHARD)
    # The changed block's shard has the same header as before: its bytes are compared, found
    # different, and it is written and hashed; the four others are not written at all.
    assert len(written) == 1
    assert v2.metadata["push"]["shards_uploaded"] == 1
    assert len(set(_digests(v2)) - set(_digests(v1))) == 1
    for f in v2.metadata["files"]:  # every recorded digest is the sha256 of its stored bytes
        assert sha256_file(_blob(reg, f["digest"])) == f["digest"]
    assert_same_state(reg.pull_state_dict("lm:v2", device="cpu"), tuned.state_dict())
    # The same weights once more write nothing, and leave nothing in the staging folder.
    written.clear()
    v3 = reg.push(tuned, "lm", shard_size=SHARD)
    assert written == [] and v3.digest == v2.digest
    assert v3.metadata["push"] == {**v2.metadata["push"], "shards_uploaded": 0,
                                   "bytes_uploaded": 0}
    assert list((reg.settings.home / "objects" / "tmp").iterdir()) == []


def test_a_blob_changed_on_disk_never_lends_its_digest(reg: Registry,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    model = block_lm()
    v1 = reg.push(model, "lm", shard_size=SHARD)
    # Flip one byte of layers.0.mlp.weight in its stored blob, and push weights equal to the
    # damaged file: comparing bytes alone would match them and record the blob's digest, the
    # sha256 of other bytes. The blob's verification memo no longer holds, so it is no match.
    entry = next(f for f in v1.metadata["files"] if "layers.0.mlp.weight" in f["tensors"])
    path = _blob(reg, entry["digest"])
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    header = json.loads(data[8:start])
    begin = start + header["layers.0.mlp.weight"]["data_offsets"][0]
    data[begin] ^= 0x01
    path.write_bytes(bytes(data))
    damaged = block_lm()
    with torch.no_grad():
        damaged.layers[0].mlp.weight.view(torch.uint8).view(-1)[0] ^= 0x01
    written = _count_writes(monkeypatch)
    v2 = reg.push(damaged, "lm", shard_size=SHARD)
    digest = next(f["digest"] for f in v2.metadata["files"]
                  if "layers.0.mlp.weight" in f["tensors"])
    assert digest != entry["digest"] and digest == sha256_file(path)
    assert len(written) == 1
    assert_same_state(reg.pull_state_dict("lm:v2", device="cpu"), damaged.state_dict())
    # The original weights again: written, hashed, and the damaged blob repaired by the upload.
    written.clear()
    v3 = reg.push(model, "lm", shard_size=SHARD)
    assert v3.digest == v1.digest and len(written) == 1
    assert sha256_file(_blob(reg, entry["digest"])) == entry["digest"]


def _remove_blob(reg: Registry, digest: str) -> None:
    path = _blob(reg, digest)
    os.chmod(path, 0o644)
    path.unlink()


@pytest.mark.parametrize("when", ["before the push asks the store", "before the commit"])
def test_a_matched_blob_removed_during_the_push_is_written_and_uploaded(
        reg: Registry, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A gc may delete a matched blob after the comparison: the push writes the shard then,
    checks it hashes to the digest recorded, and uploads it (no staged copy existed)."""
    model = block_lm()
    v1 = reg.push(model, "lm", shard_size=SHARD)
    victim = _digests(v1)[1]
    backend = reg.backend
    assert isinstance(backend, LocalBackend)
    hook = "begin_push" if when.startswith("before the push") else "commit_push"
    real: Callable[..., Any] = getattr(backend, hook)
    calls: list[int] = []

    def remove_first(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            _remove_blob(reg, victim)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(backend, hook, remove_first)
    written = _count_writes(monkeypatch)
    v2 = reg.push(model, "lm", shard_size=SHARD)
    assert v2.digest == v1.digest
    assert written and all(p.name.startswith("push-") for p in written)
    assert sha256_file(_blob(reg, victim)) == victim
    if hook == "begin_push":  # found missing before the upload: it counts as uploaded
        assert v2.metadata["push"]["shards_uploaded"] == 1
    assert_same_state(reg.pull_state_dict("lm:v2", device="cpu"), model.state_dict())


def test_a_re_push_does_not_hash_the_reused_blobs_again(reg: Registry,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A push that reuses a blob touches it (gc's grace), which changes the file's times; its
    verification memo is renewed, so neither the next pull nor the next push hashes it."""
    model = block_lm()
    reg.push(model, "lm", shard_size=SHARD)
    reg.push(model, "lm", shard_size=SHARD)  # touches every blob
    import registry.caching.cache

    hashed: list[Path] = []
    real = registry.caching.cache.sha256_file
    monkeypatch.setattr(registry.caching.cache, "sha256_file",
                        lambda p: hashed.append(Path(p)) or real(p))
    written = _count_writes(monkeypatch)
    reg.push(model, "lm", shard_size=SHARD)
    assert_same_state(reg.pull_state_dict("lm", device="cpu"), model.state_dict())
    assert hashed == [] and written == []


@pytest.mark.s3
def test_s3_compares_against_the_verified_cache_only(cutting_proxy: CuttingProxy,
                                                     s3_endpoint: str, s3_store_url: str,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = cutting_proxy
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", proxy.url)
    reg = Registry(home=tmp_path / "home", store=s3_store_url)
    reg.push(block_lm(), "lm", shard_size=SHARD)
    written = _count_writes(monkeypatch)
    # Nothing of v1 is in the cache yet: every shard is written, none is downloaded.
    proxy.requests.clear()
    reg.push(block_lm(), "lm", shard_size=SHARD)
    assert len(written) == 5
    assert not proxy.blob_requests(b"GET")
    # Once pulled, the cache holds verified copies: a fine-tune writes its changed shard.
    reg.pull_state_dict("lm", device="cpu")
    written.clear()
    proxy.requests.clear()
    v3 = reg.push(_fine_tune(block_lm()), "lm", shard_size=SHARD)
    assert len(written) == 1
    puts = proxy.blob_requests(b"PUT")
    assert len(puts) == 1 and v3.metadata["push"]["shards_uploaded"] == 1
    puller = Registry(home=tmp_path / "puller", store=s3_store_url,
                      catalog=f"sqlite:///{tmp_path / 'home' / 'registry.db'}")
    assert_same_state(puller.pull_state_dict("lm:v3", device="cpu"),
                      _fine_tune(block_lm()).state_dict())
    reg.close()
    puller.close()


def test_a_server_client_compares_against_its_cache(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The remote client keeps what it pushed in its verified cache: a fine-tune pushed from
    there writes and uploads only its changed shard; a client with an empty cache writes all."""
    from tests.integration.serving import registry_server

    with registry_server(tmp_path / "server-home", tmp_path) as server:
        client = Registry(server.url, home=tmp_path / "client")
        v1 = client.push(block_lm(), "lm", shard_size=SHARD)
        written = _count_writes(monkeypatch)
        tuned = _fine_tune(block_lm())
        v2 = client.push(tuned, "lm", shard_size=SHARD)
        assert len(written) == 1 and v2.metadata["push"]["shards_uploaded"] == 1
        assert len(set(_digests(v2)) - set(_digests(v1))) == 1
        written.clear()
        # Lineage's parent capture resolves the latest version to record the shards a push
        # reuses (provenance/capture.py), a round trip of its own: turned off here, so what is
        # checked is the unchanged-shards step alone.
        monkeypatch.setenv("REGISTRY_LINEAGE_PARENTS", "0")
        other = Registry(server.url, home=tmp_path / "other")
        # With nothing verified in its cache, the client does not ask the server for the
        # latest version's shards before it pushes (one round trip less).
        from registry.http.remote import RemoteBackend

        resolved: list[object] = []
        real_resolve = RemoteBackend.resolve
        monkeypatch.setattr(RemoteBackend, "resolve",
                            lambda self, ref: resolved.append(ref) or real_resolve(self, ref))
        v3 = other.push(tuned, "lm", shard_size=SHARD)
        assert resolved == []
        assert len(written) == 5 and v3.metadata["push"]["shards_uploaded"] == 0
        monkeypatch.setattr(RemoteBackend, "resolve", real_resolve)
        assert_same_state(other.pull_state_dict("lm:v2", device="cpu"), tuned.state_dict())
        client.close()
        other.close()


def test_a_shard_a_first_look_shows_changed_is_written_before_the_others_are_compared(
        reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing and hashing are a push's long jobs: the changed last shard starts first rather
    than alone after every comparison; the version lists its shards in order all the same."""
    v1 = reg.push(block_lm(), "lm", shard_size=SHARD)
    events: list[str] = []
    real_write, real_matching = weights.write_safetensors, weights.matching

    def write(tensors: Any, path: Any, *args: Any, **kwargs: Any) -> tuple[str, int]:
        events.append("write")
        return real_write(tensors, path, *args, **kwargs)

    def matching(*args: Any, **kwargs: Any) -> Any:
        events.append("compare")
        return real_matching(*args, **kwargs)

    monkeypatch.setattr(weights, "write_safetensors", write)
    monkeypatch.setattr(weights, "matching", matching)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one writer: the order is the schedule
    tuned = _fine_tune(block_lm())
    v2 = reg.push(tuned, "lm", shard_size=SHARD)
    assert events[:2] == ["compare", "write"], events
    assert events.count("write") == 1
    # Listed in the model's order: only the last shard (the changed block's) is new.
    assert _digests(v2)[:-1] == _digests(v1)[:-1]
    assert _digests(v2)[-1] != _digests(v1)[-1]
    assert_same_state(reg.pull_state_dict("lm:v2"), tuned.state_dict())


def test_a_first_look_is_certain_only_when_it_says_no(tmp_path: Path) -> None:
    from registry.caching.cache import VerifiedFiles
    from registry.caching.unchanged import KnownShard, matching, may_match
    from registry.files import VersionFile

    part = {"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3)}
    order, head = weights.safetensors_header(part)
    path = tmp_path / "stored.safetensors"
    digest, size = weights.write_safetensors(part, path)
    memo = VerifiedFiles(tmp_path / "verified")
    memo.remember(path, digest)
    known = {("a", "b"): [KnownShard(VersionFile("weights", "model.safetensors", digest, size,
                                                 ("a", "b")), path, memo)]}

    def look(tensors: dict[str, torch.Tensor]) -> tuple[bool, bool]:
        o, h = weights.safetensors_header(tensors)
        n = len(h) + sum(t.numel() * t.element_size() for t in tensors.values())
        return (may_match(["a", "b"], h, n, tensors, o, known),
                matching(["a", "b"], h, n, tensors, o, known) is not None)

    assert look(part) == (True, True)
    early = {"a": part["a"].clone(), "b": part["b"]}
    early["a"][0] = -1  # in the first 4 KiB
    assert look(early) == (False, False)
    late = {"a": part["a"].clone(), "b": part["b"]}
    late["a"][-1] = -1  # past the first 4 KiB of "a": only the full comparison sees it
    assert look(late) == (True, False)
    other = {"a": part["a"], "b": torch.ones(3, dtype=torch.float64)}
    assert look(other) == (False, False)
