"""Every Alembic migration, up and down, on a real SQLite file; schema checks at open."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from registry import Registry, SchemaOutOfDateError
from registry.catalog import db
from registry.catalog.models import Base


def _revisions() -> list[str]:
    script = ScriptDirectory(db._script_location())
    return [s.revision for s in reversed(list(script.walk_revisions()))]


def test_each_migration_up_and_down(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    revisions = _revisions()
    assert revisions[0] == "0001"
    for rev in revisions:
        db.upgrade(engine, rev)
        assert db.current_revision(engine) == rev
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    assert "registry_alembic_version" in tables and "alembic_version" not in tables
    # The migrated schema matches the ORM models column for column.
    for name, table in Base.metadata.tables.items():
        columns = {c["name"] for c in inspect(engine).get_columns(name)}
        assert columns == set(table.columns.keys()), name
    for rev in reversed(revisions):
        db.downgrade(engine, f"{rev}-1" if rev != revisions[0] else "base")
    assert set(inspect(engine).get_table_names()) <= {"registry_alembic_version"}
    db.upgrade(engine)
    assert db.current_revision(engine) == revisions[-1]


def test_old_schema_is_refused_unless_auto_migrating(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'c.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine, "0001")
    monkeypatch.setattr(db, "head_revision", lambda: "0002-future")
    monkeypatch.setattr(db, "_is_ancestor", lambda rev, head: True)
    with pytest.raises(SchemaOutOfDateError, match="revision 0001 but this registry needs "
                                                   "0002-future; run `registry db upgrade`"):
        db.ensure_schema(engine, auto_migrate=False)


def test_unknown_newer_revision_asks_for_a_package_upgrade(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    db.upgrade(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE registry_alembic_version SET version_num = '9999'")
    with pytest.raises(SchemaOutOfDateError, match="9999.*upgrade the registry package"):
        db.ensure_schema(engine, auto_migrate=True)


def test_embedded_catalog_migrates_itself_and_managed_one_does_not(tmp_path: Path) -> None:
    reg = Registry(home=tmp_path / "home")
    reg.push({"w": torch.ones(1)}, "m")
    assert (tmp_path / "home" / "registry.db").exists()
    managed = Registry(home=tmp_path / "home2", catalog=f"sqlite:///{tmp_path / 'm.db'}")
    managed._backend.catalog._auto_migrate = False  # type: ignore[attr-defined]
    with pytest.raises(SchemaOutOfDateError, match="no registry schema yet; run `registry db "
                                                   "upgrade`"):
        managed.list_models()
