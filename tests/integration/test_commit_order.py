"""The order of a push's writes (registry/backends.py ``commit_push``): the catalog commits
first, then the store's copies (manifest, alias table) are written under the model's lock, so
the store never disagrees with the catalog after any interleaving, and a commit or an abort
never deletes what another wrote. ``db rebuild`` then restores exactly the catalog.

Interleavings are forced with tests/integration/test_gc_race.py's stepped store.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import registry
from registry import manifest as mf
from registry.errors import NotFoundError, RegistryError, StoreUnavailableError
from registry.files import VersionFile
from tests.faults.invariants import catalog_state, rebuild_agrees
from tests.helpers import trained_mlp
from tests.integration.test_gc_race import SteppedStore, on


def _stepped(home: Path) -> registry.Registry:
    reg = registry.Registry(home=home)
    reg.backend.store = SteppedStore(reg.backend.store)  # type: ignore[attr-defined]
    return reg


def _stored_aliases(home: Path, name: str) -> dict[str, int]:
    return json.loads((home / "objects" / mf.aliases_key(name)).read_bytes())  # type: ignore[no-any-return]


def test_an_older_alias_table_never_lands_after_a_newer_one(home: Path) -> None:
    """Push A has committed ``newest -> v1`` and is about to write the store's alias table;
    right then push B commits ``newest -> v2`` (as far as it can get). Before, A wrote the
    table it had read, after B's: the store said v1, the catalog v2, and a rebuild restored
    v1. Now A writes under the model's lock what the catalog holds at that moment, and B's
    write comes after it."""
    first = _stepped(home)
    second = registry.Registry(home=home)
    done: list[Any] = []

    def push_b(_key: str) -> None:
        thread = threading.Thread(target=lambda: done.append(
            second.push(trained_mlp(1), "race", aliases=["newest"])))
        thread.start()
        # B runs to its end where nothing serializes it (the bug), or waits for A's lock.
        thread.join(timeout=2)
        done.append(thread)

    first.backend.store.hooks["put_bytes"] = on("aliases/race", push_b)  # type: ignore[attr-defined]
    first.push(trained_mlp(0), "race", aliases=["newest"])
    thread = next(d for d in done if isinstance(d, threading.Thread))
    thread.join()
    assert first.show("race@newest").version == 2
    assert _stored_aliases(home, "race") == {"newest": 2}
    assert rebuild_agrees(first.backend) == []  # type: ignore[arg-type]
    assert first.show("race@newest").version == 2


def test_many_pushers_to_one_name_leave_a_store_that_rebuilds_the_catalog(home: Path) -> None:
    """Twelve pushes at once to one name, each moving two aliases: the store's alias table
    and manifests rebuild exactly the catalog."""
    registries = [registry.Registry(home=home) for _ in range(12)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(registries))

    def push(i: int) -> None:
        try:
            start.wait()
            registries[i].push(trained_mlp(i), "crowd", aliases=["newest", f"by-{i % 3}"],
                               tags={"i": str(i)})
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(len(registries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    backend: Any = registries[0].backend
    before = catalog_state(backend)
    # "newest" names the version committed last, which need not be the highest number.
    assert len(before) == 12 and 1 <= registries[0].show("crowd@newest").version <= 12
    assert rebuild_agrees(backend) == []
    assert catalog_state(backend) == before


def _second_push(reg: registry.Registry, home: Path, name: str) -> tuple[int, dict[str, Any]]:
    """Reserve a new version of ``name`` reusing v1's weights, and its manifest."""
    v1 = reg.push(trained_mlp(), name)
    stored = mf.loads((home / "objects" / mf.manifest_key(name, 1)).read_bytes(),
                      origin="test")
    size = (home / "objects" / mf.blob_key(v1.digest)).stat().st_size
    backend: Any = reg.backend
    number, missing = backend.begin_push(
        name, None, [VersionFile("weights", "model.safetensors", v1.digest, size)])
    assert missing == []
    return number, {**stored, "version": number}


def test_concurrent_commits_of_one_push_leave_the_winner_whole(home: Path) -> None:
    """Six commits of one reserved push at once, three of one manifest and three of another
    (clients retrying through several replicas): one manifest wins, the three commits of it
    all answer its version (a repeat of a commit is that commit), the three others fail, and
    the winner's manifest stays in the store. Before, each loser's cleanup deleted it (the
    version stayed visible and a rebuild lost it)."""
    reg = registry.Registry(home=home)
    number, manifest = _second_push(reg, home, "sixfold")
    other = {**manifest, "created_at": "2001-01-01T00:00:00+00:00"}
    committers = [(registry.Registry(home=home), m) for m in [manifest, other] * 3]
    start = threading.Barrier(len(committers))
    outcomes: list[tuple[str, str]] = []

    def commit(r: registry.Registry, m: dict[str, Any]) -> None:
        start.wait()
        try:
            r.backend.commit_push("sixfold", number, m, {}, ["best"])  # type: ignore[attr-defined]
            outcomes.append(("won", m["created_at"]))
        except NotFoundError:
            outcomes.append(("lost", m["created_at"]))

    threads = [threading.Thread(target=commit, args=c) for c in committers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner = next(c for result, c in outcomes if result == "won")
    assert sorted(outcomes) == sorted([("won", winner)] * 3 + [
        ("lost", next(m["created_at"] for m in (manifest, other)
                      if m["created_at"] != winner))] * 3)
    stored = mf.loads((home / "objects" / mf.manifest_key("sixfold", number)).read_bytes(),
                      origin="test")
    assert stored["created_at"] == winner
    assert reg.show("sixfold@best").version == number
    assert rebuild_agrees(reg.backend) == []  # type: ignore[arg-type]
    assert reg.show("sixfold@best").version == number


@pytest.mark.parametrize("order", ["commit-first", "abort-first", "together"])
def test_a_commit_racing_an_abort_keeps_whichever_won_whole(home: Path, order: str) -> None:
    """A commit and an abort of the same push (a client's cleanup after a timeout while the
    commit went through): whichever wins, the other removes nothing of it. Before, an abort
    after the commit deleted the visible version's manifest."""
    reg = registry.Registry(home=home)
    number, manifest = _second_push(reg, home, "duel")
    backend: Any = reg.backend
    other: Any = registry.Registry(home=home).backend
    results: dict[str, BaseException | None] = {}

    def commit() -> None:
        try:
            backend.commit_push("duel", number, manifest, {}, [])
            results["commit"] = None
        except RegistryError as exc:
            results["commit"] = exc

    if order == "commit-first":
        commit()
        other.abort_push("duel", number)
    elif order == "abort-first":
        other.abort_push("duel", number)
        commit()
    else:
        start = threading.Barrier(2)
        threads = [threading.Thread(target=lambda: (start.wait(), commit())),
                   threading.Thread(target=lambda: (start.wait(),
                                                    other.abort_push("duel", number)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    manifest_there = (home / "objects" / mf.manifest_key("duel", number)).exists()
    if results["commit"] is None:
        assert manifest_there and reg.show(f"duel:v{number}").version == number
    else:
        assert isinstance(results["commit"], NotFoundError) and not manifest_there
        with pytest.raises(NotFoundError):
            reg.show(f"duel:v{number}")
    if order == "commit-first":
        assert results["commit"] is None
    if order == "abort-first":
        assert results["commit"] is not None
    assert rebuild_agrees(backend) == []


def test_a_store_failure_after_the_commit_reports_success_and_is_written_later(
        home: Path) -> None:
    """The catalog committed, then the store refused the manifest and the alias table: the
    push still returns its version (the store writes are reported as deferred), and the next
    change of the name writes them, so a rebuild loses nothing."""
    reg = _stepped(home)
    store: Any = reg.backend.store  # type: ignore[attr-defined]

    def outage(key: str) -> None:
        raise StoreUnavailableError(f"store unreachable writing {key}")

    store.hooks["put_bytes"] = on("manifests/late/v1", outage)
    v1 = reg.push(trained_mlp(), "late", aliases=["prod"])
    assert v1.ref == "late:v1" and reg.show("late@prod").version == 1
    assert v1.metadata["push"]["store_writes_owed"] == 2  # reported, not raised
    backend: Any = reg.backend
    assert backend.copies.owed() == [mf.aliases_key("late"), mf.manifest_key("late", 1)]
    assert not (home / "objects" / mf.manifest_key("late", 1)).exists()
    reg.set_tags("late:v1", {"k": "v"})  # the next change of "late" pays the debt
    assert backend.copies.owed() == []
    assert (home / "objects" / mf.manifest_key("late", 1)).exists()
    assert rebuild_agrees(backend) == []
    assert reg.show("late@prod").tags == {"k": "v"}


def test_gc_writes_what_a_dead_process_owed_and_removes_manifests_never_committed(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process that died between its commit and its store writes owes is written by
    gc (from the catalog); a manifest an older registry left for a push that never committed
    is removed once older than the grace, so `db rebuild` cannot restore it."""
    monkeypatch.setenv("REGISTRY_GC_GRACE", "0s")
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(), "owed", aliases=["prod"])
    objects = home / "objects"
    (objects / mf.manifest_key("owed", 1)).unlink()  # the process died before writing it
    (objects / mf.aliases_key("owed")).unlink()
    stray = objects / mf.manifest_key("owed", 7)  # never committed, no reservation
    stray.write_bytes(b"{}")
    report = reg.gc()
    assert mf.manifest_key("owed", 1) in report.reconciled
    assert report.orphan_manifests == [mf.manifest_key("owed", 7)]
    assert not stray.exists()
    assert _stored_aliases(home, "owed") == {"prod": 1}
    assert rebuild_agrees(reg.backend) == []  # type: ignore[arg-type]
