"""Migration 0006 (registry_versions.push_key) up and down on SQLite and PostgreSQL: existing
versions keep their rows with no key, keyless versions never collide, and one key is one push
per model."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import inspect

from registry.catalog import db


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> sa.Engine:
    if request.param == "sqlite":
        return db.make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    engine = db.make_engine(str(request.getfixturevalue("pg_url")))  # emptied, at head
    db.downgrade(engine, "0005")
    return engine


def _version(conn: sa.Connection, id_: int, model: int, key: str | None = None) -> None:
    columns, values = "", ""
    if key is not None:
        columns, values = ", push_key", f", '{key}'"
    conn.execute(sa.text(
        f"INSERT INTO registry_versions (id, model_id, version, state, digest, size_bytes, tags, "
        f"created_at{columns}) VALUES ({id_}, {model}, {id_}, 'ready', 'sha256:x', 1, '{{}}', "
        f"'2026-11-25'{values})"))


def test_0006_adds_and_removes_the_push_key(engine: sa.Engine) -> None:
    db.upgrade(engine, "0005")
    with engine.begin() as conn:
        for model, name in ((1, "m"), (2, "n")):
            conn.execute(sa.text("INSERT INTO registry_models (id, name, last_version, "
                                 f"created_at) VALUES ({model}, '{name}', 9, '2026-11-25')"))
        _version(conn, 1, 1)
    db.upgrade(engine, "0006")
    assert db.current_revision(engine) == "0006"
    assert "push_key" in {c["name"] for c in inspect(engine).get_columns("registry_versions")}
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT push_key FROM registry_versions")).all() == [(None,)]
        _version(conn, 2, 1)  # keyless versions never collide
        _version(conn, 3, 1, "k")
        _version(conn, 4, 2, "k")  # a key names a push per model
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _version(conn, 5, 1, "k")
    db.downgrade(engine, "0005")
    assert db.current_revision(engine) == "0005"
    assert "push_key" not in {c["name"] for c in inspect(engine).get_columns("registry_versions")}
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM registry_versions")).scalar() == 4
    db.upgrade(engine)
    assert db.current_revision(engine) == db.head_revision()
    engine.dispose()
