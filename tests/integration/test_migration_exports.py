"""Migration 0005 (registry_exports) up and down on a real SQLite file, with a version whose
export rows go away with the table and come back empty."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect

from registry.catalog import db


def test_0005_adds_and_removes_the_exports_table(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    db.upgrade(engine, "0004")
    assert "registry_exports" not in inspect(engine).get_table_names()
    db.upgrade(engine, "0005")
    assert db.current_revision(engine) == "0005"
    columns = {c["name"] for c in inspect(engine).get_columns("registry_exports")}
    assert columns == {"id", "version_id", "format", "key", "digest", "size", "record",
                       "created_at"}
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO registry_models (id, name, last_version, created_at) "
                             "VALUES (1, 'm', 1, '2026-11-23')"))
        conn.execute(sa.text("INSERT INTO registry_versions (id, model_id, version, state, "
                             "digest, size_bytes, tags, created_at) VALUES (1, 1, 1, 'ready', "
                             "'sha256:x', 1, '{}', '2026-11-23')"))
        row = ("INSERT INTO registry_exports (version_id, format, key, digest, size, record, "
               "created_at) VALUES (1, 'onnx', 'k', 'sha256:y', 1, '{}', '2026-11-23')")
        conn.execute(sa.text(row))
    # One artifact per (version, key): the same parameters cannot be recorded twice.
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text(row))
    # Deleting the version's row (as `db rebuild` does) takes its exports along.
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM registry_versions WHERE id = 1"))
        assert conn.execute(sa.text("SELECT count(*) FROM registry_exports")).scalar() == 0
    db.downgrade(engine, "0004")
    assert db.current_revision(engine) == "0004"
    assert "registry_exports" not in inspect(engine).get_table_names()
    db.upgrade(engine)
    assert "registry_exports" in inspect(engine).get_table_names()
