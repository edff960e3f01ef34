"""One flipped byte in a stored blob (file store and S3), a cached blob (S3) and a stored
manifest. A pull never returns the corrupted tensors: it raises DigestMismatchError naming the
blob, or (a cache copy) discards it and fetches the store's again; a re-push of the same weights
repairs a corrupt blob on the file store (``LocalBackend._holds``); ``db rebuild`` refuses a
corrupt manifest and leaves the catalog as it was."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path
from typing import Any

import pytest

import registry
from registry import manifest as mf
from registry.errors import CheckpointError, DigestMismatchError, RegistryError
from registry.files import version_files
from tests.faults.invariants import Tally, after_fault, local, no_orphans
from tests.faults.worker import build, same_weights

pytestmark = pytest.mark.faults

SEED = int(os.environ.get("FAULTS_SEED") or random.SystemRandom().randrange(2**32))
TRIALS = 6


def _flip(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    at = rng.randrange(len(data))
    return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:], at


def _flip_file(path: Path, rng: random.Random) -> int:
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    data, at = _flip(path.read_bytes(), rng)
    path.write_bytes(data)
    os.chmod(path, 0o444)
    return at


def _pull_refuses(reg: registry.Registry, ref: str, seed: int, digest: str) -> list[str]:
    """The pull raises DigestMismatchError naming ``digest`` and returns nothing."""
    try:
        state = reg.pull_state_dict(ref, device="cpu")
    except DigestMismatchError as exc:
        hexd = digest.split(":", 1)[1]
        return [] if hexd in str(exc) else [f"the DigestMismatchError names no blob: {exc}"]
    except RegistryError as exc:
        return [f"pull raised {type(exc).__name__}, not DigestMismatchError: {exc}"]
    ok = same_weights(state, seed)
    return [f"pull of {ref} returned {'the right' if ok else 'CORRUPTED'} tensors from a "
            "corrupt blob without an error"]


def _shard(reg: registry.Registry, ref: str, rng: random.Random) -> tuple[str, int]:
    files = version_files(local(reg).resolve(registry.refs.parse(ref)).manifest)
    chosen = rng.choice(files)
    return chosen.digest, chosen.size


def _s3(monkeypatch: pytest.MonkeyPatch, store_url: str) -> None:
    monkeypatch.setenv("REGISTRY_STORE_URL", store_url)
    monkeypatch.setenv("REGISTRY_SHARD_SIZE", "512KiB")


def test_a_flipped_byte_in_a_file_store_blob_is_refused_and_repaired_by_a_push(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_SHARD_SIZE", "512KiB")
    rng = random.Random(f"{SEED}-file-blob")
    tally = Tally("flipped byte, file store blob", SEED)
    reg = registry.Registry()
    try:
        for i in range(TRIALS):
            seed = 100 + i
            v = reg.push(build(seed), "flip", tags={"seed": str(seed)})
            digest, _ = _shard(reg, v.ref, rng)
            at = _flip_file(home / "objects" / mf.blob_key(digest), rng)
            found = _pull_refuses(reg, v.ref, seed, digest)
            again = reg.push(build(seed), "flip", tags={"seed": str(seed)})
            if not same_weights(reg.pull_state_dict(v.ref, device="cpu"), seed):
                found.append("the re-push did not repair the blob")
            found += after_fault(reg, "flip", next_seed=500 + i)
            tally.record(f"trial {i}: {digest} byte {at} ({again.ref})", found)
    finally:
        reg.close()
    tally.check()


@pytest.mark.s3
def test_a_flipped_byte_in_an_s3_blob_is_refused(
        s3_endpoint: str, s3_store_url: str, raw_s3: Any, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3 a re-push does not repair a corrupt blob of the same size (``_holds`` trusts a
    remote copy's size; every pull verifies it instead): the pull keeps refusing, typed."""
    _s3(monkeypatch, s3_store_url)
    rng = random.Random(f"{SEED}-s3-blob")
    tally = Tally("flipped byte, S3 store blob", SEED)
    reg = registry.Registry()
    cache = local(reg).cache.root
    try:
        for i in range(TRIALS):
            seed = 100 + i
            v = reg.push(build(seed), "flip", tags={"seed": str(seed)})
            digest, _ = _shard(reg, v.ref, rng)
            key = "team/" + mf.blob_key(digest)
            data, at = _flip(raw_s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read(), rng)
            raw_s3.put_object(Bucket=s3_bucket, Key=key, Body=data)
            found = _pull_refuses(reg, v.ref, seed, digest)
            found += [f"a corrupt download was left in the cache: {p}"
                      for p in (cache / "blobs").glob("*/" + digest.split(":")[1])]
            reg.push(build(seed), "flip", tags={"seed": str(seed)})
            found += _pull_refuses(reg, v.ref, seed, digest)  # still refused, never loaded
            # Put the right bytes back (what an operator does), so the other checks can run.
            raw_s3.put_object(Bucket=s3_bucket, Key=key, Body=_flip_back(data, at, digest))
            found += after_fault(reg, "flip", next_seed=500 + i)
            tally.record(f"trial {i}: {digest} byte {at}", found)
    finally:
        reg.close()
    tally.check()


def _flip_back(data: bytes, at: int, digest: str) -> bytes:
    from registry.io.digests import sha256_bytes

    for bit in range(8):
        fixed = data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:]
        if sha256_bytes(fixed) == digest:
            return fixed
    raise AssertionError("the flipped bit could not be found again")


@pytest.mark.s3
def test_a_flipped_byte_in_a_cached_blob_is_discarded_and_fetched_again(
        s3_endpoint: str, s3_store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _s3(monkeypatch, s3_store_url)
    rng = random.Random(f"{SEED}-cache-blob")
    tally = Tally("flipped byte, S3 cache copy", SEED)
    reg = registry.Registry()
    cache = local(reg).cache
    try:
        for i in range(TRIALS):
            seed = 100 + i
            v = reg.push(build(seed), "flip", tags={"seed": str(seed)})
            reg.pull_state_dict(v.ref, device="cpu")  # fills the cache
            digest, _ = _shard(reg, v.ref, rng)
            at = _flip_file(cache.path(digest), rng)
            found: list[str] = []
            try:
                if not same_weights(reg.pull_state_dict(v.ref, device="cpu"), seed):
                    found.append("the pull returned CORRUPTED tensors from the cache")
            except RegistryError as exc:
                found.append(f"the pull failed instead of fetching again: {exc}")
            found += after_fault(reg, "flip", next_seed=500 + i)
            tally.record(f"trial {i}: {digest} byte {at}", found)
    finally:
        reg.close()
    tally.check()


def test_a_flipped_byte_in_a_stored_manifest_is_refused_by_rebuild(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pull reads the catalog's copy, so it is unaffected; `db rebuild` must refuse the
    corrupt store copy with a CheckpointError naming it and leave the catalog as it was, or
    (a flip that leaves the same manifest, e.g. in JSON whitespace) restore the same state."""
    monkeypatch.setenv("REGISTRY_SHARD_SIZE", "512KiB")
    rng = random.Random(f"{SEED}-manifest")
    tally = Tally("flipped byte, stored manifest", SEED)
    reg = registry.Registry()
    backend = local(reg)
    try:
        for i in range(TRIALS * 2):
            seed = 100 + i
            v = reg.push(build(seed), "flip", tags={"seed": str(seed), "team": "vision"},
                         aliases=["production"])
            path = home / "objects" / mf.manifest_key("flip", v.version)
            good = path.read_bytes()
            data, at = _flip(good, rng)
            path.write_bytes(data)
            before = _full_state(backend)
            found: list[str] = []
            if not same_weights(reg.pull_state_dict(v.ref, device="cpu"), seed):
                found.append("the pull returned other tensors")
            try:
                backend.rebuild()
                outcome = "accepted"
            except CheckpointError as exc:
                outcome = "refused"
                if f"v{v.version}.json" not in str(exc):
                    found.append(f"the refusal does not name the manifest: {exc}")
            except RegistryError as exc:
                outcome = type(exc).__name__
                found.append(f"rebuild refused with {outcome}, not a CheckpointError: {exc}")
            after = _full_state(backend)
            if after != before:
                changed = sorted(k for k in before.keys() | after.keys()
                                 if before.get(k) != after.get(k))
                found.append(f"rebuild ({outcome}) changed the catalog at {changed} "
                             f"(byte {at}: {good[at - 20:at + 20]!r} -> "
                             f"{data[at - 20:at + 20]!r})")
            path.write_bytes(good)
            if outcome == "accepted":
                backend.rebuild()  # the good copy back, so the next trial starts clean
            found += no_orphans(backend)
            tally.record(f"trial {i}: byte {at} of {path.name}", found, outcome)
    finally:
        reg.close()
    tally.check()


def _full_state(backend: Any) -> dict[str, Any]:
    return {f"{r.name}:v{r.version}": (r.digest, sorted(r.aliases), r.tags, r.manifest)
            for name in backend.list_models() for r in backend.list_versions(name)}
