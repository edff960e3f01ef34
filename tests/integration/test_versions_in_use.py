"""Versions people depend on (issue #30): a version behind an alias is not deleted by accident,
and the short digest ``registry ls`` prints names a version."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import registry
from registry import NotFoundError, RefError, Registry, VersionAliasedError
from tests.helpers import clean_env, run_cli, trained_mlp
from tests.integration.serving import Service, registry_server


def test_deleting_an_aliased_version_is_refused_unless_forced(reg: Registry) -> None:
    reg.push({"w": torch.ones(2)}, "m", aliases=["production", "staging"])
    reg.push({"w": torch.zeros(2)}, "m")
    with pytest.raises(VersionAliasedError) as info:
        reg.delete_version("m:v1")
    message = str(info.value)
    assert "m@production, m@staging" in message
    assert "force=True" in message and "registry rm --force m:v1" in message
    assert info.value.code == "version_aliased" and info.value.aliases == ["production",
                                                                            "staging"]
    assert reg.show("m@production").version == 1, "nothing was deleted"

    assert reg.delete_version("m:v2").version == 2  # no alias points there: deleted as before
    reg.set_alias("m", "staging", 1)
    deleted = reg.delete_version("m:v1", force=True)
    assert deleted.aliases == ["production", "staging"]
    with pytest.raises(NotFoundError):
        reg.show("m@production")


def test_module_level_delete_version_takes_force(home: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_HOME", str(home))
    registry.push({"w": torch.ones(1)}, "m", aliases=["prod"])
    with pytest.raises(VersionAliasedError, match="m@prod"):
        registry.delete_version("m:v1")
    assert registry.delete_version("m:v1", force=True).ref == "m:v1"


def test_a_digest_prefix_of_twelve_hex_digits_resolves(reg: Registry) -> None:
    a = reg.push({"w": torch.ones(2)}, "m")
    b = reg.push({"w": torch.zeros(2)}, "m")
    reg.push({"w": torch.ones(2)}, "m")  # a's bytes again: the newest with that digest is v3
    assert reg.show(f"m@{a.digest[:19]}").version == 3
    assert reg.show(f"m@{b.digest[:19]}").version == 2
    assert reg.show(f"m@{b.digest[:40]}").version == 2
    assert reg.pull_state_dict(f"m@{b.digest[:19]}", device="cpu")["w"].sum() == 0
    other = "0123456789ab" if not a.digest[7:].startswith("0123456789ab") else "ba9876543210"
    with pytest.raises(NotFoundError, match="no version of m has a digest starting with"):
        reg.show(f"m@sha256:{other}")
    with pytest.raises(RefError, match="at least 12; this one has 11"):
        reg.show(f"m@{a.digest[:18]}")


def test_an_ambiguous_digest_prefix_lists_the_candidates(reg: Registry, home: Path) -> None:
    reg.push({"w": torch.ones(2)}, "m")
    reg.push({"w": torch.zeros(2)}, "m")
    # Two real digests sharing 12 hex digits would take 2^24 pushes to find: give the catalog
    # rows such digests instead (resolution reads nothing else).
    twins = ["sha256:" + "5d134060e707" + c * 52 for c in "ab"]
    with sqlite3.connect(home / "registry.db") as db:
        for version, digest in zip((1, 2), twins, strict=True):
            db.execute("UPDATE registry_versions SET digest = ? WHERE version = ?",
                       (digest, version))
    fresh = Registry(home=home)
    try:
        with pytest.raises(RefError) as info:
            fresh.show("m@sha256:5d134060e707")
        assert "ambiguous" in str(info.value)
        assert twins[0] in str(info.value) and twins[1] in str(info.value)
        assert fresh.show(f"m@{twins[1][:20]}").version == 2
    finally:
        fresh.close()


# -- through the server and the CLI ---------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("server")
    with registry_server(root / "home", root) as service:
        yield service


def test_the_server_refuses_an_aliased_delete_with_the_same_error(server: Service) -> None:
    remote = Registry(server.url)
    try:
        first = remote.push(trained_mlp(0), "served", aliases=["production"])
        with pytest.raises(VersionAliasedError, match="served@production.*force=True"):
            remote.delete_version("served:v1")
        assert remote.show("served@production").ref == first.ref
        assert remote.show(f"served@{first.digest[:19]}").ref == first.ref
        assert remote.delete_version("served:v1", force=True).aliases == ["production"]
        with pytest.raises(NotFoundError, match="was deleted"):
            remote.show("served:v1")
    finally:
        remote.close()


@pytest.mark.slow
def test_cli_rm_refuses_an_aliased_version_and_force_deletes_it(home: Path) -> None:
    env = clean_env(home)
    reg = Registry(home=home)
    mv = reg.push({"w": torch.ones(1)}, "m", aliases=["production"])
    reg.close()
    refused = run_cli("rm", "m:v1", env=env)
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.startswith("error: ") and "registry rm --force m:v1" in refused.stderr
    shown = run_cli("show", f"m@{mv.digest[:19]}", env=env, check=True).stdout
    assert "m:v1" in shown
    forced = run_cli("rm", "--force", "m:v1", env=env, check=True)
    assert "deleted m:v1" in forced.stdout and "@production" in forced.stdout
