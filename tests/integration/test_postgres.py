"""The catalog on the real PostgreSQL server: migrations, typed errors, concurrent pushes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import inspect, text

import registry
from registry.catalog.db import (
    VERSION_TABLE,
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from registry.errors import (
    CatalogUnavailableError,
    NotFoundError,
    SchemaOutOfDateError,
    VersionExistsError,
)
from tests.helpers import assert_same_state, clean_env, run_cli, trained_mlp

from .conftest import PostgresServer, _drop_registry_tables, free_port

pytestmark = pytest.mark.postgres

TABLES = {"registry_models", "registry_versions", "registry_aliases", "registry_version_files"}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- migrations ---------------------------------------------------------------------------

def test_migrations_run_up_and_down(pg_database: str) -> None:
    engine = make_engine(pg_database)
    try:
        _drop_registry_tables(engine)
        assert current_revision(engine) is None
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert TABLES | {VERSION_TABLE} <= _tables(pg_database)
        downgrade(engine, "base")
        assert current_revision(engine) is None
        assert not (TABLES & _tables(pg_database))
        upgrade(engine)  # and up again from nothing
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


@pytest.mark.slow
def test_db_upgrade_command_migrates_postgres(pg_database: str, tmp_path: Path) -> None:
    engine = make_engine(pg_database)
    _drop_registry_tables(engine)
    engine.dispose()
    env = clean_env(tmp_path / "home", REGISTRY_CATALOG_URL=pg_database)
    result = run_cli("db", "upgrade", env=env, check=True)
    assert f"catalog at revision {head_revision()}" in result.stdout
    assert _tables(pg_database) >= TABLES


# -- typed errors -------------------------------------------------------------------------

def test_unmigrated_database_names_the_upgrade_command(pg_database: str, home: Path) -> None:
    engine = make_engine(pg_database)
    _drop_registry_tables(engine)
    engine.dispose()
    reg = registry.Registry(catalog=pg_database)
    try:
        with pytest.raises(SchemaOutOfDateError, match="run `registry db upgrade`"):
            reg.list_models()
    finally:
        reg.close()


def test_catalog_behind_the_code_names_the_upgrade_command(pg_url: str, home: Path) -> None:
    from alembic.script import ScriptDirectory

    from registry.catalog.db import _script_location

    head = head_revision()
    previous = ScriptDirectory(_script_location()).get_revision(head).down_revision
    engine = make_engine(pg_url)
    downgrade(engine, str(previous) if previous else "base")
    engine.dispose()
    reg = registry.Registry(catalog=pg_url)  # PostgreSQL catalogs never migrate themselves
    try:
        with pytest.raises(SchemaOutOfDateError, match="run `registry db upgrade`") as info:
            reg.list_models()
        if previous:
            assert f"at revision {previous} but this registry needs {head}" in str(info.value)
    finally:
        reg.close()


def test_catalog_at_an_unknown_revision_says_to_upgrade_the_package(pg_url: str) -> None:
    engine = make_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999_future'"))
    engine.dispose()
    reg = registry.Registry(catalog=pg_url)
    try:
        with pytest.raises(SchemaOutOfDateError, match="9999_future.*upgrade the registry"):
            reg.list_models()
    finally:
        reg.close()


def test_down_database_is_catalog_unavailable_without_the_password(home: Path) -> None:
    url = f"postgresql+psycopg://registry:s3cret-pw@127.0.0.1:{free_port()}/registry"
    reg = registry.Registry(catalog=url)
    try:
        started = time.monotonic()
        with pytest.raises(CatalogUnavailableError) as info:
            reg.list_models()
        assert time.monotonic() - started < 30
    finally:
        reg.close()
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert "127.0.0.1" in message and "REGISTRY_CATALOG_URL" in message
    assert isinstance(info.value, ConnectionError)


def test_missing_database_is_catalog_unavailable(postgres: PostgresServer, home: Path) -> None:
    reg = registry.Registry(catalog=postgres.url("reg_test_does_not_exist"))
    try:
        with pytest.raises(CatalogUnavailableError, match="reg_test_does_not_exist"):
            reg.show("m")
    finally:
        reg.close()


def test_db_upgrade_against_a_down_database_exits_with_one_line(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://registry:s3cret-pw@127.0.0.1:{free_port()}/registry"
    result = run_cli("db", "upgrade", env=clean_env(tmp_path / "home", REGISTRY_CATALOG_URL=url))
    assert result.returncode == CatalogUnavailableError.exit_code
    assert result.stderr.startswith("error: catalog ") and result.stderr.count("\n") == 1
    assert "s3cret-pw" not in result.stderr


# -- the catalog on PostgreSQL ------------------------------------------------------------

def test_registry_round_trip_on_postgres(pg_url: str, home: Path) -> None:
    reg = registry.Registry(catalog=pg_url)
    try:
        model = trained_mlp()
        v1 = reg.push(model, "mlp", tags={"dataset": "toy"}, aliases=["staging"])
        v2 = reg.push(trained_mlp(seed=1), "mlp")
        assert (v1.version, v2.version) == (1, 2)
        assert_same_state(reg.pull_state_dict("mlp@staging"), model.state_dict())
        reg.set_alias("mlp", "production", 2)
        reg.set_tags("mlp:v2", {"owner": "vision"})
        assert reg.show("mlp@production").tags == {"owner": "vision"}
        assert reg.show(f"mlp@{v1.digest}").version == 1
        assert reg.show(f"mlp@{v1.digest[:19]}").version == 1  # the prefix `ls` prints
        with pytest.raises(VersionExistsError, match="v3"):
            reg.push(model, "mlp:v2")
        reg.delete_version("mlp:v1", force=True)  # @staging points there
        with pytest.raises(NotFoundError, match="deleted"):
            reg.show("mlp:v1")
        assert reg.push(model, "mlp").version == 3  # numbers are never reused
        assert [mv.version for mv in reg.list_versions("mlp")] == [2, 3]
        assert reg.list_models() == ["mlp"]
    finally:
        reg.close()


def test_registry_survives_a_dropped_database_connection(pg_url: str, postgres: PostgresServer,
                                                         home: Path) -> None:
    reg = registry.Registry(catalog=pg_url)
    try:
        reg.push({"w": torch.ones(2)}, "survivor")
        database = pg_url.rsplit("/", 1)[1]
        # What a database restart or failover does to the connections in the pool.
        postgres.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         f"WHERE datname = '{database}' AND pid <> pg_backend_pid()")
        assert reg.show("survivor").version == 1
    finally:
        reg.close()


_WORKER = textwrap.dedent("""
    import json, os, sys, threading, time
    from pathlib import Path
    import torch
    import registry

    catalog, store, home, start, worker, pushes = sys.argv[1:7]
    worker, pushes = int(worker), int(pushes)
    reg = registry.Registry(catalog=catalog, store=store, home=home)
    while not os.path.exists(start):  # start every process's pushes at the same moment
        time.sleep(0.01)
    results, errors = [], []

    def push(i):
        value = float(worker * 1000 + i)
        try:
            mv = reg.push({"w": torch.full((16,), value)}, "contended", aliases=["newest"],
                          tags={"pusher": f"{worker}-{i}"})
            results.append((mv.version, value, mv.digest))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=push, args=(i,)) for i in range(pushes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reg.close()
    print(json.dumps({"results": results, "errors": errors}))
""")


@pytest.mark.slow
def test_concurrent_pushes_get_gap_free_unique_versions(pg_url: str, tmp_path: Path) -> None:
    processes, pushes = 8, 10
    store = (tmp_path / "objects").as_uri()
    start = tmp_path / "go"
    env = clean_env(tmp_path / "home")
    workers = [
        subprocess.Popen([sys.executable, "-c", _WORKER, pg_url, store, str(tmp_path / f"h{n}"),
                          str(start), str(n), str(pushes)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(processes)
    ]
    time.sleep(0.5)
    start.touch()
    outputs: list[dict[str, Any]] = []
    for proc in workers:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))

    errors = [e for o in outputs for e in o["errors"]]
    assert errors == []
    results = [tuple(r) for o in outputs for r in o["results"]]
    versions = sorted(v for v, _, _ in results)
    assert versions == list(range(1, processes * pushes + 1))

    reg = registry.Registry(catalog=pg_url, store=store, home=tmp_path / "check")
    try:
        listed = reg.list_versions("contended")
        assert [mv.version for mv in listed] == versions
        by_version = {mv.version: mv for mv in listed}
        for version, value, digest in results:  # each number holds what its pusher sent
            assert by_version[version].digest == digest
            assert reg.pull_state_dict(f"contended:v{version}")["w"][0].item() == value
        assert reg.show("contended@newest").version in by_version
    finally:
        reg.close()
