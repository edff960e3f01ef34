"""Protected aliases, holds, retention and the trash: the checks at the catalog operation, so
the embedded API, the CLI and a server agree; each change one event; all of it restored by
`db rebuild` (on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import registry
from registry.errors import (
    AliasProtectedError,
    ForbiddenError,
    NotFoundError,
    RefError,
    VersionExistsError,
    VersionHeldError,
)
from registry.store import layout
from server.auth import AuthFile
from tests.helpers import clean_env, run_cli
from tests.integration.serving import registry_server


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def trash_week(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_TRASH_DAYS", "7")


def _kinds(reg: registry.Registry, since: int) -> list[str]:
    return [e.kind for e in reg.events(since_id=since)]


def _last_id(reg: registry.Registry) -> int:
    events = reg.events()
    return events[-1].id if events else 0


def _three(reg: registry.Registry, name: str = "net") -> None:
    for i in range(3):
        reg.push({"w": torch.full((3,), float(i))}, name)


def test_a_protected_alias_moves_and_goes_only_with_force(catalog_url: str, home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        _three(reg)
        reg.set_alias("net", "prod", 1)
        start = _last_id(reg)
        reg.protect_alias("net", "prod")
        reg.protect_alias("net", "prod")  # already: no second event
        with pytest.raises(AliasProtectedError, match=r"net@prod is protected; moving it needs "
                                                      r"force=True"):
            reg.set_alias("net", "prod", 2)
        with pytest.raises(AliasProtectedError, match="deleting it"):
            reg.delete_alias("net", "prod")
        with pytest.raises(AliasProtectedError):  # a push may not move it either
            reg.push({"w": torch.ones(2)}, "net", aliases=["prod"])
        assert reg.show("net@prod").version == 1
        shown = reg.show("net:v1")
        assert shown.metadata["governance"] == {"protected_aliases": ["prod"]}
        assert "governance" not in reg.show("net:v2").metadata
        reg.set_alias("net", "prod", 2, force=True)
        assert reg.governance("net").protected == ("prod",)  # protection stays with the alias
        with pytest.raises(AliasProtectedError):
            reg.set_alias("net", "prod", 3)
        reg.unprotect_alias("net", "prod")
        reg.set_alias("net", "prod", 3)
        assert _kinds(reg, start) == ["alias.protected", "alias.set", "alias.unprotected",
                                      "alias.set"]
        with pytest.raises(NotFoundError, match="set the alias first"):
            reg.protect_alias("net", "nope")
    finally:
        reg.close()


def test_a_trashed_version_is_gone_until_restored(catalog_url: str, home: Path,
                                                  trash_week: None) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        _three(reg)
        digest = reg.show("net:v2").digest
        reg.delete_version("net:v2")
        with pytest.raises(NotFoundError, match=r"trash: `registry restore net:v2` brings it back"):
            reg.show("net:v2")
        assert [mv.version for mv in reg.list_versions("net")] == [1, 3]
        with pytest.raises(VersionExistsError):  # its number stays retired
            reg.push({"w": torch.ones(2)}, "net:v2")
        (trashed,) = reg.list_trash()
        assert (trashed.ref, trashed.digest, trashed.expired) == ("net:v2", digest, False)
        assert trashed.restorable_until > trashed.deleted_at
        report = reg.gc()  # within the window: nothing of v2 is freed
        assert report.purged == [] and digest not in report.deleted
        restored = reg.restore_version("net:v2")
        assert restored.digest == digest and restored.aliases == []
        assert torch.equal(reg.pull_state_dict("net:v2", device="cpu")["w"], torch.ones(3))
        assert reg.list_trash() == []
        with pytest.raises(RefError, match="not deleted"):
            reg.restore_version("net:v2")
        kinds = [e.kind for e in reg.history("net")][-2:]
        assert kinds == ["version.deleted", "version.restored"]
    finally:
        reg.close()


def test_gc_purges_the_trash_past_its_window(home: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("REGISTRY_TRASH_DAYS", "0")
    reg = registry.Registry()
    try:
        reg.push({"w": torch.ones(3)}, "net")
        gone = reg.push({"w": torch.zeros(3)}, "net")
        reg.delete_version("net:v2")
        with pytest.raises(NotFoundError, match="trash window"):
            reg.restore_version("net:v2")
        report = reg.gc()
        assert report.purged == ["net:v2"] and gone.digest in report.deleted
        with pytest.raises(NotFoundError, match="purged"):
            reg.restore_version("net:v2")
        store = reg.backend.store  # type: ignore[attr-defined]
        assert store.has(layout.tombstone_key("net", 2)) == 0
        assert store.has(layout.manifest_key("net", 2)) is None
        purged = reg.history("net")[-1]
        assert (purged.kind, purged.version, purged.details["purged"]) == \
            ("version.deleted", 2, True)
    finally:
        reg.close()


def test_a_held_version_cannot_be_deleted_by_anyone(catalog_url: str, home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        _three(reg)
        start = _last_id(reg)
        assert reg.hold("net:v1", "audit 2026-Q4").version == 1
        assert reg.show("net:v1").metadata["governance"]["hold"]["reason"] == "audit 2026-Q4"
        for force in (False, True):
            with pytest.raises(VersionHeldError, match=r"net:v1 is held \('audit 2026-Q4'"):
                reg.delete_version("net:v1", force=force)
        reg.set_retention("net", keep_last=1)
        report = reg.gc()  # REGISTRY_TRASH_DAYS=0 here: what expires is purged at once
        assert report.expired == ["net:v2"] and report.purged == ["net:v2"]  # v1 is held
        reg.release("net:v1")
        with pytest.raises(NotFoundError, match="not held"):
            reg.release("net:v1")
        reg.delete_version("net:v1")
        assert [(e.kind, e.version) for e in reg.events(since_id=start)] == [
            ("version.held", 1), ("retention.set", None), ("version.expired", 2),
            ("version.deleted", 2), ("version.released", 1), ("version.deleted", 1)]
        with pytest.raises(RefError, match="reason"):
            reg.hold("net:v3", "  ")
    finally:
        reg.close()


def test_retention_never_expires_what_is_aliased_held_or_new(catalog_url: str, home: Path,
                                                             trash_week: None) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        for i in range(6):
            reg.push({"w": torch.full((3,), float(i))}, "net")
        reg.set_alias("net", "prod", 1)
        reg.hold("net:v2", "kept for the paper")
        reg.set_retention("net", keep_last=2)
        report = reg.gc()
        assert report.expired == ["net:v3", "net:v4"]
        assert [mv.version for mv in reg.list_versions("net")] == [1, 2, 5, 6]
        assert [(t.ref, t.expired) for t in reg.list_trash("net")] == [("net:v3", True),
                                                                       ("net:v4", True)]
        assert [e.kind for e in reg.history("net")][-2:] == ["version.expired"] * 2
        reg.set_retention("net", max_age="30d")  # nothing is that old
        assert reg.gc().expired == []
        reg.set_retention("net")
        assert reg.governance("net").retention is None
        with pytest.raises(RefError, match="keep_last"):
            reg.set_retention("net", keep_last=0)
        with pytest.raises(RefError, match="90d"):
            reg.set_retention("net", max_age="soon")
    finally:
        reg.close()


def test_rebuild_restores_trash_holds_protection_and_retention(catalog_url: str, home: Path,
                                                               trash_week: None) -> None:
    reg = registry.Registry(catalog=catalog_url)
    try:
        _three(reg)
        reg.set_alias("net", "prod", 3)
        reg.protect_alias("net", "prod")
        reg.hold("net:v1", "legal")
        reg.set_retention("net", keep_last=5, max_age="90d")
        reg.delete_version("net:v2")
        before = (reg.governance("net"), reg.list_trash(), reg.history("net"),
                  [mv.ref for mv in reg.list_versions("net")])
        stored = json.loads(reg.backend.store.get_bytes(  # type: ignore[attr-defined]
            layout.governance_key("net")))
        assert stored["protected"] == ["prod"] and list(stored["trashed"]) == ["2"]
        reg.backend.rebuild()
        after = (reg.governance("net"), reg.list_trash(), reg.history("net"),
                 [mv.ref for mv in reg.list_versions("net")])
        assert after == before
        with pytest.raises(AliasProtectedError):
            reg.set_alias("net", "prod", 1)
        reg.restore_version("net:v2")
    finally:
        reg.close()


def test_through_a_server_a_protected_alias_needs_an_admin_token(tmp_path: Path) -> None:
    home, auth = tmp_path / "home", tmp_path / "auth.json"
    tokens = {name: AuthFile(auth).create(name, scopes) for name, scopes in
              [("ci", ["write"]), ("boss", ["admin"])]}
    with registry_server(home, tmp_path, env_extra={"REGISTRY_AUTH_FILE": str(auth),
                                                    "REGISTRY_TRASH_DAYS": "7"}) as server:
        ci = registry.Registry(server.url, token=tokens["ci"])
        boss = registry.Registry(server.url, token=tokens["boss"])
        try:
            _three(ci)
            ci.set_alias("net", "prod", 1)
            with pytest.raises(ForbiddenError, match="needs admin"):
                ci.protect_alias("net", "prod")
            boss.protect_alias("net", "prod")
            with pytest.raises(AliasProtectedError, match="admin scope"):
                ci.set_alias("net", "prod", 2, force=True)
            with pytest.raises(AliasProtectedError):
                ci.delete_version("net:v1", force=True)
            assert ci.show("net@prod").version == 1
            assert ci.show("net:v1").metadata["governance"] == {"protected_aliases": ["prod"]}
            boss.set_alias("net", "prod", 2)
            ci.hold("net:v3", "review")
            with pytest.raises(VersionHeldError):
                boss.delete_version("net:v3", force=True)
            with pytest.raises(ForbiddenError):
                ci.release("net:v3")
            boss.release("net:v3")
            ci.delete_version("net:v3")
            assert [t.ref for t in ci.list_trash()] == ["net:v3"]
            ci.restore_version("net:v3")
            with pytest.raises(ForbiddenError):
                ci.set_retention("net", keep_last=1)
            boss.set_retention("net", keep_last=1)
            assert boss.governance("net").retention.keep_last == 1  # type: ignore[union-attr]
            assert boss.gc().expired == ["net:v1"]
            actors = {(e.kind, e.actor) for e in boss.history("net")}
            assert {("alias.protected", "boss"), ("version.held", "ci"),
                    ("version.released", "boss"), ("version.restored", "ci"),
                    ("version.expired", "boss")} <= actors
        finally:
            ci.close()
            boss.close()


def test_cli_governance_commands(home: Path, trash_week: None) -> None:
    reg = registry.Registry(home=home)
    try:
        _three(reg)
    finally:
        reg.close()
    env = clean_env(home, REGISTRY_TRASH_DAYS="7")
    out = run_cli("alias", "net@prod", "1", "--protect", env=env, check=True).stdout
    assert "net@prod -> net:v1" in out and "now protected" in out
    moved = run_cli("alias", "net@prod", "2", env=env)
    assert moved.returncode == 14 and "net@prod is protected" in moved.stderr
    assert run_cli("alias", "net", "prod", "2", "--force", env=env).returncode == 0
    assert "prod (protected)" in run_cli("show", "net:v2", env=env, check=True).stdout
    assert "prod (protected)" in run_cli("ls", "net", env=env, check=True).stdout
    assert run_cli("hold", "net:v1", "--reason", "audit", env=env).returncode == 0
    held = run_cli("rm", "net:v1", "--force", env=env)
    assert held.returncode == 15 and "is held ('audit'" in held.stderr
    assert run_cli("release", "net:v1", env=env).returncode == 0
    assert run_cli("rm", "net:v1", env=env).returncode == 0
    listed = run_cli("ls", "--trash", "--json", env=env, check=True).stdout
    assert [t["name"] + ":v" + str(t["version"]) for t in json.loads(listed)] == ["net:v1"]
    assert "restored net:v1" in run_cli("restore", "net:v1", env=env, check=True).stdout
    out = run_cli("retention", "net", "--keep-last", "2", "--max-age", "12w", env=env,
                  check=True).stdout
    assert out.strip() == "net: keep the last 2, expire after 84 days"
    assert "no retention policy" in run_cli("retention", "net", "--clear", env=env,
                                            check=True).stdout
    kinds = [json.loads(line)["kind"] for line in
             run_cli("audit", "--json", env=env, check=True).stdout.splitlines()]
    assert kinds[3:] == ["alias.set", "alias.protected", "alias.set", "version.held",
                         "version.released", "version.deleted", "version.restored",
                         "retention.set", "retention.set"]


def test_the_mlflow_mirror_shows_protection_holds_and_the_last_alias_change(
        tmp_path: Path, trash_week: None) -> None:
    from mlflow import MlflowClient

    from registry.mirror.mirror_mlflow import sync

    reg = registry.Registry(home=tmp_path / "home")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        _three(reg)
        reg.set_alias("net", "prod", 1)
        sync(reg.backend, uri)  # type: ignore[arg-type]
        assert "registry.protected_aliases" not in client.get_model_version("net", "1").tags
        reg.set_alias("net", "prod", 2)
        reg.protect_alias("net", "prod")
        reg.hold("net:v3", "audit")
        report = sync(reg.backend, uri)  # type: ignore[arg-type]
        assert report.mirrored == ["net:v1", "net:v2", "net:v3"]
        v2 = client.get_model_version("net", "2").tags
        assert v2["registry.protected_aliases"] == "prod"
        assert v2["registry.last_alias_change"].startswith("prod: v1 -> v2 by local:")
        assert client.get_model_version("net", "3").tags["registry.hold"].startswith("audit (by")
        assert "registry.last_alias_change" not in client.get_model_version("net", "1").tags
        reg.release("net:v3")
        assert sync(reg.backend, uri).mirrored == ["net:v3"]  # type: ignore[arg-type]
        assert "registry.hold" not in client.get_model_version("net", "3").tags
        # A trashed version leaves the view; restored, it comes back under its own number.
        reg.delete_version("net:v3")
        assert sync(reg.backend, uri).removed == ["net:v3"]  # type: ignore[arg-type]
        reg.restore_version("net:v3")
        assert sync(reg.backend, uri).mirrored == ["net:v3"]  # type: ignore[arg-type]
        assert client.get_model_version("net", "3").tags["registry.ref"] == "net:v3"
    finally:
        reg.close()
