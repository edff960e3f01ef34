"""The pull path's resolve (registry/catalog/lookup.py, warm.py): read-only, never stale, same
answers, and no query while an SQLite catalog is unchanged."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from sqlalchemy import event

from registry import NotFoundError, Registry
from registry.catalog import warm as warm_module
from registry.catalog.lookup import Found
from registry.catalog.warm import WarmResolves
from registry.refs import parse


def test_a_pull_sees_a_version_deleted_by_another_process(home: Path) -> None:
    reader, writer = Registry(home=home), Registry(home=home)
    try:
        writer.push({"w": torch.ones(2)}, "m")
        writer.push({"w": torch.zeros(2)}, "m")
        assert torch.equal(reader.pull_state_dict("m:v1", device="cpu")["w"], torch.ones(2))
        writer.delete_version("m:v1")
        with pytest.raises(NotFoundError, match=r"m:v1 not found \(it was deleted\)"):
            reader.pull_state_dict("m:v1", device="cpu")
        assert reader.show("m").version == 2
        writer.delete_version("m:v2")
        with pytest.raises(NotFoundError, match="has no versions"):
            reader.pull_state_dict("m", device="cpu")
    finally:
        reader.close()
        writer.close()


def test_a_pull_follows_an_alias_moved_by_another_process(home: Path) -> None:
    reader, writer = Registry(home=home), Registry(home=home)
    try:
        writer.push({"w": torch.ones(2)}, "m", aliases=["prod"])
        writer.push({"w": torch.zeros(2)}, "m")
        assert torch.equal(reader.pull_state_dict("m@prod", device="cpu")["w"], torch.ones(2))
        writer.set_alias("m", "prod", 2)
        assert torch.equal(reader.pull_state_dict("m@prod", device="cpu")["w"], torch.zeros(2))
        assert reader.show("m@prod").aliases == ["prod"]
        assert reader.show("m:v1").aliases == []
        writer.delete_alias("m", "prod")
        with pytest.raises(NotFoundError, match="m@prod not found: m has no aliases"):
            reader.pull_state_dict("m@prod", device="cpu")
        writer.push({"w": torch.full((2,), 3.0)}, "m")
        assert torch.equal(reader.pull_state_dict("m", device="cpu")["w"], torch.full((2,), 3.0))
    finally:
        reader.close()
        writer.close()


def test_a_resolve_does_not_wait_for_a_writer(reg: Registry, home: Path) -> None:
    reg.push({"w": torch.ones(2)}, "m", aliases=["prod"])
    database = reg.backend.catalog.engine.url.database  # type: ignore[attr-defined]
    writer = sqlite3.connect(database, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # holds the write lock, as a push committing does
    try:
        found: list[int] = []
        thread = threading.Thread(target=lambda: found.append(reg.show("m@prod").version),
                                  daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert found == [1], "resolve waited for the write lock"
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def _statements(reg: Registry) -> list[str]:
    seen: list[str] = []
    engine = reg.backend.catalog.engine  # type: ignore[attr-defined]
    event.listen(engine, "before_cursor_execute",
                 lambda _conn, _cursor, statement, *_rest: seen.append(statement))
    return seen


def test_a_warm_resolve_runs_no_query_and_still_sees_another_process(
        reg: Registry, home: Path) -> None:
    reg.push({"w": torch.ones(2)}, "m", aliases=["prod"])
    reg.push({"w": torch.zeros(2)}, "m")
    seen = _statements(reg)
    assert reg.show("m@prod").version == 1
    assert seen, "the first resolve reads the catalog"
    seen.clear()
    for _ in range(3):
        assert torch.equal(reg.pull_state_dict("m@prod", device="cpu")["w"], torch.ones(2))
    assert seen == [], "nothing was committed, yet a resolve queried the catalog"
    moved = subprocess.run(
        [sys.executable, "-c", "import sys, registry; "
         "registry.Registry(home=sys.argv[1]).set_alias('m', 'prod', 2)", str(home)],
        capture_output=True, text=True, timeout=120)
    assert moved.returncode == 0, moved.stderr
    assert torch.equal(reg.pull_state_dict("m@prod", device="cpu")["w"], torch.zeros(2))
    assert seen, "another process committed: the resolve must read the catalog again"
    assert reg.show("m@prod").aliases == ["prod"]
    assert reg.show("m:v1").aliases == []


def test_a_record_edited_by_its_caller_does_not_change_the_next_resolve(reg: Registry) -> None:
    reg.push({"w": torch.ones(2)}, "m", tags={"team": "a"}, aliases=["prod"])
    first = reg.backend.resolve(parse("m@prod"))
    first.manifest["tensors"].clear()
    first.tags["team"] = "b"
    first.aliases.append("edited")
    again = reg.backend.resolve(parse("m@prod"))
    assert list(again.manifest["tensors"]) == ["w"]
    assert again.tags == {"team": "a"}
    assert again.aliases == ["prod"]
    assert torch.equal(reg.pull_state_dict("m@prod", device="cpu")["w"], torch.ones(2))


def test_a_catalog_file_replaced_by_another_is_read_again(tmp_path: Path) -> None:
    """A warm row is kept for one file: a catalog swapped for another file (a restore from a
    backup) has another inode, so the next resolve reads it, whatever its data version."""
    path = tmp_path / "catalog.db"
    for name in (path, tmp_path / "other.db"):
        conn = sqlite3.connect(name, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
        conn.close()
    warm = WarmResolves(str(path))
    try:
        ref = parse("m:v1")
        stamp = warm.stamp()
        assert stamp is not None
        found = Found(version=1, digest="sha256:" + "0" * 64, size_bytes=1, manifest="{}",
                      tags="{}", aliases=())
        warm.put(ref, stamp, found)
        assert warm.get(ref, warm.stamp()) is found
        os.replace(tmp_path / "other.db", path)
        assert warm.stamp() != stamp
        assert warm.get(ref, warm.stamp()) is None
        path.unlink()
        assert warm.stamp() is None, "a catalog that is gone gives no stamp to keep rows by"
    finally:
        warm.close()


def test_warm_rows_are_bounded_by_count_and_by_characters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "catalog.db"
    sqlite3.connect(path).close()
    monkeypatch.setattr(warm_module, "MAX_REMEMBERED", 3)
    monkeypatch.setattr(warm_module, "MAX_REMEMBERED_CHARS", 250)
    warm = WarmResolves(str(path))
    try:
        stamp = warm.stamp()

        def found(chars: int) -> Found:
            return Found(version=1, digest="sha256:" + "0" * 64, size_bytes=1,
                         manifest="x" * chars, tags="{}", aliases=())

        refs = [parse(f"m:v{i}") for i in range(1, 6)]
        for ref in refs[:4]:
            warm.put(ref, stamp, found(10))
        assert [warm.get(r, stamp) is not None for r in refs[:4]] == [False, True, True, True]
        warm.get(refs[1], stamp)  # used last: kept over refs[2]
        warm.put(refs[4], stamp, found(200))  # a fourth row: v3, used least recently, goes
        assert [warm.get(r, stamp) is not None for r in refs] == [False, True, False, True, True]
        warm.put(refs[0], stamp, found(300))  # over the limit alone: not kept, nothing goes
        assert [warm.get(r, stamp) is not None for r in refs] == [False, True, False, True, True]
        # The two used least go: one for the count, one for the 255 characters.
        warm.put(refs[2], stamp, found(45))
        assert [warm.get(r, stamp) is not None for r in refs] == [False, False, True, False, True]
    finally:
        warm.close()
