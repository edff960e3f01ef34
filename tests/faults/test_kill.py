"""SIGKILL at random moments of real pushes and pulls (forked from tests/faults/worker.py), on
the embedded registry and on S3 (moto) + PostgreSQL. Each kill lands after a delay drawn
uniformly within an unkilled run's measured duration, from a seeded RNG (``FAULTS_SEED`` to
replay; the seed is in every summary and assertion message); after each, every check of
``invariants.after_fault`` must hold."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import registry
from tests.faults.invariants import Tally, Zygote, after_fault
from tests.faults.worker import build
from tests.helpers import clean_env

pytestmark = pytest.mark.faults

SEED = int(os.environ.get("FAULTS_SEED") or random.SystemRandom().randrange(2**32))
TRIALS = int(os.environ.get("FAULTS_TRIALS") or 20)  # kills per scenario
SHARD = "512KiB"  # about 4 shards a push, so a kill can fall between two uploads


@pytest.fixture
def embedded(home: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("REGISTRY_SHARD_SIZE", SHARD)
    return clean_env(home, REGISTRY_SHARD_SIZE=SHARD)


@pytest.fixture
def s3_pg(home: Path, s3_endpoint: str, s3_store_url: str, pg_url: str,
          monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("REGISTRY_SHARD_SIZE", SHARD)
    monkeypatch.setenv("REGISTRY_STORE_URL", s3_store_url)
    monkeypatch.setenv("REGISTRY_CATALOG_URL", pg_url)
    return clean_env(home, REGISTRY_SHARD_SIZE=SHARD, REGISTRY_STORE_URL=s3_store_url,
                     REGISTRY_CATALOG_URL=pg_url, REGISTRY_S3_ENDPOINT_URL=s3_endpoint)


@pytest.fixture(params=["embedded", pytest.param("s3_pg", marks=[pytest.mark.s3,
                                                         pytest.mark.postgres])])
def setup(request: pytest.FixtureRequest, tmp_path: Path,
          home: Path) -> Iterator[tuple[str, Zygote, registry.Registry]]:
    env = request.getfixturevalue(request.param)
    zygote = Zygote(env, tmp_path / "worker.log")
    reg = registry.Registry()
    try:
        yield request.param, zygote, reg
    finally:
        reg.close()
        zygote.close()


def _cold_cache(reg: registry.Registry) -> None:
    """Forget every cached blob, so the pull downloads (S3); the file store reads in place."""
    root = reg.backend.cache.root  # type: ignore[attr-defined]
    for sub in ("blobs", "verified"):
        shutil.rmtree(root / sub, ignore_errors=True)


def test_killed_pushes_leave_nothing_half_done(
        setup: tuple[str, Zygote, registry.Registry]) -> None:
    where, zygote, reg = setup
    rng = random.Random(f"{SEED}-push-{where}")
    tally = Tally(f"SIGKILL push ({where})", SEED)
    outcome, measured = zygote.run({"op": "push", "name": "killed", "seed": 1})
    assert outcome == "ok", f"an unkilled push failed (seed {SEED}):\n{zygote.log_tail()}"
    seen: dict[str, str] = {}
    for i in range(TRIALS):
        delay = rng.uniform(0, measured)
        outcome, _ = zygote.run({"op": "push", "name": "killed", "seed": 100 + i},
                                kill_after=delay)
        found = ["an unkilled push failed"] if outcome == "failed" else []
        found += after_fault(reg, "killed", next_seed=500 + i, seen=seen)
        tally.record(f"trial {i}, kill after {delay:.3f}s of {measured:.3f}s ({outcome})",
                     found, outcome)
    tally.check()


def test_killed_alias_moves_leave_no_event_without_its_change(
        setup: tuple[str, Zygote, registry.Registry]) -> None:
    """A process moving an alias over and over, SIGKILLed at a random moment: every move that
    committed has its event with the right ``previous``, and no event exists for a move that
    did not (tests/faults/invariants.events_agree)."""
    where, zygote, reg = setup
    rng = random.Random(f"{SEED}-moves-{where}")
    tally = Tally(f"SIGKILL alias moves ({where})", SEED)
    for seed in (1, 2, 3):
        reg.push(build(seed), "moved", tags={"seed": str(seed)})
    job = {"op": "moves", "name": "moved", "count": 40, "versions": 3}
    outcome, measured = zygote.run(job)
    assert outcome == "ok", f"unkilled alias moves failed (seed {SEED}):\n{zygote.log_tail()}"
    seen: dict[str, str] = {}
    for i in range(TRIALS):
        delay = rng.uniform(0, measured)
        outcome, _ = zygote.run(job, kill_after=delay)
        found = ["unkilled alias moves failed"] if outcome == "failed" else []
        found += after_fault(reg, "moved", next_seed=700 + i, seen=seen)
        tally.record(f"trial {i}, kill after {delay:.3f}s of {measured:.3f}s ({outcome})",
                     found, outcome)
    tally.check()


def test_killed_pulls_leave_nothing_half_done(
        setup: tuple[str, Zygote, registry.Registry]) -> None:
    where, zygote, reg = setup
    rng = random.Random(f"{SEED}-pull-{where}")
    tally = Tally(f"SIGKILL pull ({where})", SEED)
    v = reg.push(build(7), "pulled", tags={"seed": "7"}, aliases=["production"])
    job = {"op": "pull", "ref": v.ref, "seed": 7}
    _cold_cache(reg)
    outcome, measured = zygote.run(job)
    assert outcome == "ok", f"an unkilled pull failed (seed {SEED}):\n{zygote.log_tail()}"
    seen: dict[str, str] = {}
    for i in range(TRIALS):
        _cold_cache(reg)
        delay = rng.uniform(0, measured)
        outcome, _ = zygote.run(job, kill_after=delay)
        found = ["an unkilled pull failed"] if outcome == "failed" else []
        found += after_fault(reg, "pulled", next_seed=900 + i, seen=seen)
        tally.record(f"trial {i}, kill after {delay:.3f}s of {measured:.3f}s ({outcome})",
                     found, outcome)
    tally.check()


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (the push's cleanup is switched off)."""


def test_a_push_killed_between_its_manifest_and_its_commit_is_not_restored_by_rebuild(
        reg: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the S3 + PostgreSQL kill trials found (gc dropped the reservation and freed its
    blobs, but left the manifest, and `db rebuild` restored a version that did not pull): the
    window forced deterministically. gc's removal of manifests of versions neither committed
    nor pending (registry/gc.py ``orphan_manifests``) keeps this test meaningful."""
    from registry import manifest as mf
    from tests.faults.invariants import local, rebuild_agrees, visible_versions_intact

    backend = local(reg)
    reg.push(build(1), "m", tags={"seed": "1"})

    def killed(*_a: object, **_k: object) -> None:
        raise _Killed()

    with monkeypatch.context() as m:
        m.setattr(backend.catalog, "commit", killed)
        m.setattr(backend.store, "delete", lambda key: None)
        m.setattr(backend, "abort_push", lambda name, number: None)
        with pytest.raises(_Killed):
            reg.push(build(2), "m", tags={"seed": "2"})
    # The commit comes first now, so the crash left no manifest; an older registry's crash
    # did (written before its commit), and gc removes that one as well.
    assert backend.store.has(mf.manifest_key("m", 2)) is None
    leftover = {**mf.loads(backend.store.get_bytes(mf.manifest_key("m", 1)), origin="v1"),
                "version": 2}
    backend.store.put_bytes(mf.manifest_key("m", 2), mf.dumps(leftover))
    reg.gc()
    assert backend.store.has(mf.manifest_key("m", 2)) is None
    assert rebuild_agrees(backend) == []
    assert [v.version for v in reg.list_versions("m")] == [1]
    assert visible_versions_intact(reg) == []
