"""The append-only event log: one event per change, written in the change's transaction, with
its actor and the alias's previous version; copied to the store so `db rebuild` restores the
history exactly; read through the API, the CLI and a server (on SQLite and PostgreSQL)."""

from __future__ import annotations

import getpass
import json
import threading
from pathlib import Path

import httpx
import pytest
import torch

import registry
from registry.catalog.repository import Catalog
from registry.errors import (
    CheckpointError,
    ForbiddenError,
    NotFoundError,
    VersionAliasedError,
)
from registry.events import Event, acting_as
from registry.store import layout
from registry.versions import Versions
from server.auth import AuthFile
from tests.helpers import clean_env, run_cli
from tests.integration.serving import registry_server

ME = f"local:{getpass.getuser()}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return str(request.getfixturevalue("pg_url"))


def _summary(events: list[Event]) -> list[tuple[str, int | None, str | None, int | None]]:
    return [(e.kind, e.version, e.alias, e.previous) for e in events]


def _changes(reg: registry.Registry) -> None:
    """One of each change that exists: push (with an alias), move, tag, unalias, delete."""
    reg.push({"w": torch.ones(3)}, "net", aliases=["prod"], tags={"team": "a"})
    reg.push({"w": torch.zeros(3)}, "net")
    reg.set_alias("net", "prod", 2)
    reg.set_tags("net:v1", {"stage": "old", "team": None})
    reg.set_alias("net", "canary", 1)
    reg.delete_alias("net", "canary")
    reg.delete_version("net:v1")


def test_every_change_appends_one_event(catalog_url: str, home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        _changes(reg)
        history = reg.history("net")
        assert _summary(history) == [
            ("version.created", 1, None, None), ("alias.set", 1, "prod", None),
            ("version.created", 2, None, None), ("alias.set", 2, "prod", 1),
            ("tags.set", 1, None, None), ("alias.set", 1, "canary", None),
            ("alias.deleted", None, "canary", 1), ("version.deleted", 1, None, None)]
        assert [e.id for e in history] == sorted(e.id for e in history)
        assert len({e.id for e in history}) == len(history)
        assert {e.actor for e in history} == {ME}
        created = history[0]
        assert created.details["digest"] == reg.history("net")[0].details["digest"]
        assert created.details["tags"] == {"team": "a"}
        assert history[4].details == {"set": {"stage": "old"}, "removed": ["team"]}
        assert history[-1].details["force"] is False
        # Every `at` is ISO-8601 UTC and never goes back.
        ats = [e.at for e in history]
        assert all(a.endswith("+00:00") for a in ats) and ats == sorted(ats)
        # The alias's own history, the newest N, and since a time.
        assert _summary(reg.history("net", "prod")) == [("alias.set", 1, "prod", None),
                                                        ("alias.set", 2, "prod", 1)]
        assert reg.history("net", limit=2) == history[-2:]
        assert reg.history("net", since=history[5].at) == history[5:]
        assert reg.events() == history
        assert reg.events(since_id=history[2].id, limit=3) == history[3:6]
        with pytest.raises(NotFoundError, match="'nope' not found"):
            reg.history("nope")
    finally:
        reg.close()


def test_a_refused_change_appends_no_event(catalog_url: str, home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        reg.push({"w": torch.ones(3)}, "net", aliases=["prod"])
        before = reg.events()
        with pytest.raises(NotFoundError):
            reg.set_alias("net", "prod", 7)
        with pytest.raises(VersionAliasedError):
            reg.delete_version("net:v1")
        with pytest.raises(NotFoundError):
            reg.delete_alias("net", "nope")
        assert reg.events() == before
        # A forced delete of an aliased version records the alias it dropped.
        reg.delete_version("net:v1", force=True)
        assert _summary(reg.events()[len(before):]) == [("version.deleted", 1, None, None),
                                                        ("alias.deleted", None, "prod", 1)]
        # Deleted models keep their history.
        assert len(reg.history("net")) == len(before) + 2
    finally:
        reg.close()


def test_the_actor_is_who_acts(home: Path) -> None:
    reg = registry.Registry()
    try:
        with acting_as("ci-bot"):
            reg.push({"w": torch.ones(3)}, "net")
        reg.set_alias("net", "prod", 1)
        assert [e.actor for e in reg.history("net")] == ["ci-bot", ME]
    finally:
        reg.close()


def test_rebuild_restores_history_exactly(catalog_url: str, home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        _changes(reg)
        before, everything = reg.history("net"), reg.events()
        stored = sorted(reg.backend.store.list(layout.EVENTS))  # type: ignore[attr-defined]
        assert stored == [layout.event_key(e.id) for e in everything]
        assert json.loads(reg.backend.store.get_bytes(stored[3])) == \
            everything[3].to_dict()  # type: ignore[attr-defined]
        # Wipe the log as a lost catalog would, then rebuild from the store.
        catalog: Catalog = reg.backend.catalog  # type: ignore[attr-defined]
        catalog.restore_events([])
        assert reg.events() == []
        reg.backend.rebuild()
        assert reg.history("net") == before
        assert reg.events() == everything
        # The log goes on after the highest restored id.
        moved = reg.set_alias("net", "prod", 2)
        assert moved.version == 2
        last = reg.events()[-1]
        assert last.id > everything[-1].id and last.previous == 2
    finally:
        reg.close()


def test_gc_writes_the_copies_a_dead_process_owed(home: Path) -> None:
    reg = registry.Registry()
    try:
        reg.push({"w": torch.ones(3)}, "net", aliases=["prod"])
        store = reg.backend.store  # type: ignore[attr-defined]
        lost = layout.event_key(reg.events()[1].id)
        store.delete(lost)  # as if the process died between its commit and this write
        report = reg.gc()
        assert lost in report.reconciled
        assert store.get_bytes(lost)
    finally:
        reg.close()


def test_rebuild_refuses_an_event_object_the_registry_did_not_write(home: Path) -> None:
    reg = registry.Registry()
    try:
        reg.push({"w": torch.ones(3)}, "net")
        store = reg.backend.store  # type: ignore[attr-defined]
        key = layout.event_key(1)
        bad = json.loads(store.get_bytes(key))
        for change, why in [({"kind": "alias.stolen"}, "unknown kind"),
                            ({"id": 2}, "holds event 2, not 1"),
                            ({"name": "../evil"}, "not a registry event"),
                            ({"details": []}, "details must be an object")]:
            store.put_bytes(key, json.dumps({**bad, **change}).encode())
            with pytest.raises(CheckpointError, match=why):
                reg.backend.rebuild()
        store.put_bytes(key, json.dumps(bad).encode())
        store.put_bytes("events/7.json", b"{}")
        with pytest.raises(CheckpointError, match="events/7.json"):
            reg.backend.rebuild()
        assert _summary(reg.history("net")) == [("version.created", 1, None, None)]
    finally:
        reg.close()


def test_concurrent_alias_moves_are_one_event_each_in_commit_order(catalog_url: str,
                                                                   home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    for i in range(4):
        reg.push({"w": torch.full((3,), float(i))}, "net")
    start = len(reg.events())
    errors: list[BaseException] = []

    def mover(worker: int) -> None:
        own = Versions(catalog=catalog_url)
        try:
            for i in range(10):
                own.set_alias("net", "prod", 1 + (worker + i) % 4)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=mover, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        moves = reg.events()[start:]
        assert len(moves) == 40 and {e.kind for e in moves} == {"alias.set"}
        assert [e.id for e in moves] == sorted(e.id for e in moves)
        previous = None
        for e in moves:  # each move saw the one committed just before it
            assert e.previous == previous
            previous = e.version
        assert reg.show("net@prod").version == moves[-1].version
    finally:
        reg.close()


# -- through a server ----------------------------------------------------------------------

def test_a_server_records_the_token_name_and_guards_the_audit_log(tmp_path: Path) -> None:
    home, auth = tmp_path / "home", tmp_path / "auth.json"
    tokens = {name: AuthFile(auth).create(name, scopes) for name, scopes in
              [("ci", ["write"]), ("boss", ["admin"])]}
    with registry_server(home, tmp_path, env_extra={"REGISTRY_AUTH_FILE": str(auth)}) as server:
        ci = registry.Registry(server.url, token=tokens["ci"])
        boss = registry.Registry(server.url, token=tokens["boss"])
        try:
            ci.push({"w": torch.ones(3)}, "net", aliases=["prod"])
            ci.push({"w": torch.zeros(3)}, "net")
            boss.set_alias("net", "prod", 2)
            history = ci.history("net")
            assert _summary(history) == [
                ("version.created", 1, None, None), ("alias.set", 1, "prod", None),
                ("version.created", 2, None, None), ("alias.set", 2, "prod", 1)]
            assert [e.actor for e in history] == ["ci", "ci", "ci", "boss"]
            assert ci.history("net", "prod", limit=1) == history[-1:]
            with pytest.raises(ForbiddenError, match="needs admin"):
                ci.events()
            assert boss.events() == history
            assert boss.events(since_id=history[1].id, limit=1) == history[2:3]
            answer = httpx.get(server.url + "/api/v1/events", params={"limit": 2},
                               headers={"Authorization": f"Bearer {tokens['boss']}"})
            assert answer.json()["next"] == history[1].id
            assert answer.json()["events"] == [e.to_dict() for e in history[:2]]
        finally:
            ci.close()
            boss.close()
    # The embedded view of the same catalog reads the same log.
    local = Versions(home=home)
    try:
        assert local.history("net") == history
    finally:
        local.close()


def test_cli_history_and_audit(tmp_path: Path, home: Path) -> None:
    reg = registry.Registry(home=home)
    try:
        _changes(reg)
        everything = reg.events()
    finally:
        reg.close()
    env = clean_env(home)
    table = run_cli("history", "net@prod", env=env, check=True).stdout
    assert "alias.set" in table and "net@prod: v1 -> v2" in table and ME in table
    assert "version.created" not in table
    listed = json.loads(run_cli("history", "net", "--json", env=env, check=True).stdout)
    assert listed == [e.to_dict() for e in everything]
    lines = run_cli("audit", "--json", "--since", everything[3].at, env=env,
                    check=True).stdout.splitlines()
    assert [json.loads(line) for line in lines] == [e.to_dict() for e in everything[3:]]
    missing = run_cli("history", "nope", env=env)
    assert missing.returncode != 0 and "'nope' not found" in missing.stderr


def test_two_replicas_moving_one_alias_log_each_move_once_in_commit_order(
        catalog_url: str, tmp_path: Path) -> None:
    """Two `registry serve` processes on one catalog and one store, four clients moving the
    same alias through both at once: one event per move, ids in commit order, each
    ``previous`` the version the move before it set."""
    home = tmp_path / "home"
    env = {"REGISTRY_CATALOG_URL": catalog_url, "REGISTRY_STORE_URL": f"file://{tmp_path}/store"}
    seeding = registry.Registry(catalog=catalog_url, store=env["REGISTRY_STORE_URL"])
    try:
        for i in range(3):
            seeding.push({"w": torch.full((3,), float(i))}, "net")
        start = len(seeding.events())
    finally:
        seeding.close()
    with registry_server(home, tmp_path, env_extra=env) as one, \
            registry_server(home, tmp_path, env_extra=env) as two:
        errors: list[BaseException] = []

        def mover(worker: int) -> None:
            clients = [registry.Registry(one.url), registry.Registry(two.url)]
            try:
                for i in range(8):
                    clients[(worker + i) % 2].set_alias("net", "prod", 1 + (worker + i) % 3)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                for c in clients:
                    c.close()

        threads = [threading.Thread(target=mover, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        reader = registry.Registry(two.url)
        try:
            moves = reader.events(since_id=None)[start:]
            assert reader.show("net@prod").version == moves[-1].version
        finally:
            reader.close()
    assert len(moves) == 32 and {e.kind for e in moves} == {"alias.set"}
    assert [e.id for e in moves] == sorted({e.id for e in moves})
    previous = None
    for e in moves:
        assert e.previous == previous
        previous = e.version
    assert {e.actor for e in moves} == {"anonymous"}  # an open loopback server's caller
