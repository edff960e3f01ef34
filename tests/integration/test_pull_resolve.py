"""The pull path's resolve (registry/catalog/lookup.py): read-only, never stale, same answers."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import torch

from registry import NotFoundError, Registry


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
