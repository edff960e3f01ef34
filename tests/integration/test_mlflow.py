"""MLflow mirroring against a real `mlflow server` process, checked through its REST API."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import registry
from registry.errors import MlflowUnavailableError
from registry.mirror.mirror_mlflow import sync
from registry.mirror.mlflow_client import create_aligned
from registry.mirror.mlflow_view import version_tags
from tests.helpers import MLP, clean_env, run_cli, trained_mlp
from tests.integration.serving import (
    Service,
    free_port,
    registry_exe,
    registry_server,
    start_mlflow_server,
    stop_group,
    wait_until_up,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("mlflow")
    service = start_mlflow_server(root / "mlflow.db", root)
    yield service
    stop_group(service)


def _get(mlflow: Service, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{mlflow.url}/api/2.0/mlflow/{path}", params=params, timeout=30)


def _version(mlflow: Service, name: str, version: int) -> dict[str, Any] | None:
    response = _get(mlflow, "model-versions/get", name=name, version=str(version))
    if response.status_code != 200:
        return None
    mv = response.json()["model_version"]
    mv["tag_map"] = {t["key"]: t["value"] for t in mv.get("tags", [])}
    return mv


def _aliases(mlflow: Service, name: str) -> dict[str, str]:
    response = _get(mlflow, "registered-models/get", name=name)
    if response.status_code != 200:
        return {}
    # MLflow has answered alias versions as strings and, since 3.18, as integers: compare text.
    return {a["alias"]: str(a["version"]) for a in response.json()["registered_model"]
            .get("aliases", [])}


def _eventually(check: Callable[[], Any], what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_server_mirrors_versions_tags_and_aliases(mlflow_server: Service, tmp_path: Path) -> None:
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url}
    with registry_server(tmp_path / "home", tmp_path, env_extra=env) as service:
        reg = registry.Registry(service.url)
        try:
            reg.push(trained_mlp(0), "mirrored", tags={"dataset": "toy"})
            second = reg.push(trained_mlp(1), "mirrored", aliases=["production"])
            mv = _eventually(lambda: _version(mlflow_server, "mirrored", 2), "v2 in MLflow")
            tags = mv["tag_map"]
            assert tags["registry.ref"] == "mirrored:v2"
            assert tags["registry.digest"] == second.digest
            assert tags["registry.devices"] == "cpu"
            assert tags["registry.dtypes"] == "float32,int64"
            assert tags["registry.wrapping"] == "none"
            assert tags["registry.params"] == str(second.metadata["source"]["params"])
            # The store object by its key: the server's own paths stay out of MLflow's tags.
            assert tags["registry.blob_key"] == f"blobs/sha256/{second.digest[7:]}"
            assert "registry.blob_uri" not in tags
            assert not [v for v in tags.values() if str(tmp_path) in v]
            # A tracking server refuses local-path sources without a run; the ref stands in.
            assert mv["source"] == "registry:/mirrored/v2"
            assert "| trained on | cpu |" in mv["description"]
            v1 = _version(mlflow_server, "mirrored", 1)
            assert v1 is not None and v1["tag_map"]["dataset"] == "toy"
            _eventually(lambda: _aliases(mlflow_server, "mirrored") == {"production": "2"},
                        "alias production -> 2")
            # Later changes follow: alias moved, tag set, version deleted.
            reg.set_alias("mirrored", "production", 1)
            reg.set_tags("mirrored:v1", {"owner": "vision"})
            reg.delete_version("mirrored:v2")
            _eventually(lambda: _version(mlflow_server, "mirrored", 2) is None, "v2 removed")
            _eventually(lambda: _aliases(mlflow_server, "mirrored") == {"production": "1"},
                        "alias production -> 1")
            _eventually(lambda: (_version(mlflow_server, "mirrored", 1) or {})
                        .get("tag_map", {}).get("owner") == "vision", "owner tag on v1")
        finally:
            reg.close()


def test_push_never_waits_for_a_dead_mlflow(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with registry_server(tmp_path / "home", tmp_path,
                         env_extra={"MLFLOW_TRACKING_URI": dead}) as service:
        reg = registry.Registry(service.url)
        try:
            started = time.monotonic()
            mv = reg.push(trained_mlp(), "unmirrored")
            assert time.monotonic() - started < 10
            assert reg.show("unmirrored").digest == mv.digest
            _eventually(lambda: "mirroring to MLflow at" in service.output(),
                        "the mirror's warning", timeout=60)
        finally:
            reg.close()
    embedded = registry.Registry(home=tmp_path / "home")
    try:
        states = embedded.backend.catalog.mirror_states()  # type: ignore[attr-defined]
        assert states == [("unmirrored", 1, "ready", None)]  # pending
    finally:
        embedded.close()


def test_sync_is_incremental_idempotent_and_follows_deletions(mlflow_server: Service,
                                                              tmp_path: Path) -> None:
    home = tmp_path / "home"
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(0), "synced")
    reg.push(trained_mlp(1), "synced")
    reg.delete_version("synced:v1")  # never mirrored: MLflow's numbers still line up
    reg.push(trained_mlp(2), "synced", aliases=["staging"])
    reg.close()
    down = run_cli("mlflow", "sync", env=clean_env(
        home, MLFLOW_TRACKING_URI=f"http://127.0.0.1:{free_port()}"))
    assert down.returncode == MlflowUnavailableError.exit_code
    assert "versions stay pending: run `registry mlflow sync`" in down.stderr
    assert down.stderr.count("\n") == 1  # one line, no traceback
    live = clean_env(home, MLFLOW_TRACKING_URI=mlflow_server.url)
    first = run_cli("mlflow", "sync", env=live, check=True)
    assert "mirrored 2, removed 0, unchanged 0, repaired 0" in first.stdout
    assert _version(mlflow_server, "synced", 1) is None
    assert _version(mlflow_server, "synced", 2)["tag_map"]["registry.ref"] == "synced:v2"
    assert _version(mlflow_server, "synced", 3)["tag_map"]["registry.ref"] == "synced:v3"
    assert _aliases(mlflow_server, "synced") == {"staging": "3"}
    # The rest in-process (each CLI run pays for importing torch and mlflow).
    reg = registry.Registry(home=home)
    try:
        again = sync(reg.backend, mlflow_server.url)  # type: ignore[arg-type]
        assert (again.mirrored, again.removed, again.unchanged) == ([], [], 2)
        reg.delete_version("synced:v2")
        after = sync(reg.backend, mlflow_server.url)  # type: ignore[arg-type]
        assert (after.mirrored, after.removed, after.unchanged) == ([], ["synced:v2"], 1)
        assert _version(mlflow_server, "synced", 2) is None
        assert _version(mlflow_server, "synced", 3) is not None
        # --full repairs MLflow after someone edited it by hand, keeping the numbers: v3 comes
        # back as MLflow version 3 (the registered model is recreated), never as version 4.
        from mlflow import MlflowClient

        MlflowClient(mlflow_server.url, mlflow_server.url).delete_model_version("synced", "3")
        repaired = sync(reg.backend, mlflow_server.url, full=True)  # type: ignore[arg-type]
        assert repaired.repaired == {"synced:v3": ["restored"]}
        assert _version(mlflow_server, "synced", 3)["tag_map"]["registry.ref"] == "synced:v3"
        assert _version(mlflow_server, "synced", 4) is None
        assert _aliases(mlflow_server, "synced") == {"staging": "3"}
    finally:
        reg.close()


def test_an_incremental_sync_puts_back_what_was_edited_in_the_mlflow_ui(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    reg = registry.Registry(home=tmp_path / "home")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        reg.push(trained_mlp(0), "edited", tags={"dataset": "toy"}, factory=MLP)
        reg.push(trained_mlp(1), "edited", aliases=["production"], factory=MLP)
        reg.push(trained_mlp(2), "edited", factory=MLP)
        reg.export("edited:v1", format="pt2", input_shapes=[(2, 8)])
        first = sync(reg.backend, uri)  # type: ignore[arg-type]
        assert first.mirrored == ["edited:v1", "edited:v2", "edited:v3"]
        assert first.repaired == {}
        v1 = client.get_model_version("edited", "1")
        assert "| export pt2 | inputs 2x8, cpu/float32, " in v1.description  # exports listed
        assert "| exports | - |" in client.get_model_version("edited", "2").description
        expected = {v: dict(client.get_model_version("edited", str(v)).tags) for v in (1, 2, 3)}
        descriptions = {v: client.get_model_version("edited", str(v)).description
                        for v in (1, 2, 3)}
        for tags in expected.values():  # no absolute path of the registry's host in any tag
            assert not [v for v in tags.values() if str(tmp_path) in v]
            assert tags["registry.blob_key"].startswith("blobs/sha256/")

        # Someone edits the "read-only view" in the UI.
        client.set_model_version_tag("edited", "1", "dataset", "other")
        client.delete_model_version_tag("edited", "2", "registry.digest")
        client.set_model_version_tag("edited", "2", "note", "added in the UI")
        client.update_model_version("edited", "3", description="edited in the UI")
        client.set_registered_model_alias("edited", "production", "3")
        client.set_registered_model_alias("edited", "rogue", "1")
        client.update_registered_model("edited", description="edited too")

        report = sync(reg.backend, uri)  # type: ignore[arg-type]
        assert (report.mirrored, report.removed, report.unchanged) == ([], [], 3)
        assert report.repaired == {
            "edited:v1": ["tags"],
            "edited:v2": ["tags", "alias production"],
            "edited:v3": ["description"],
            "edited@rogue": ["alias removed"],
            "edited": ["model description"],
        }
        assert {v: dict(client.get_model_version("edited", str(v)).tags)
                for v in (1, 2, 3)} == expected
        assert client.get_model_version("edited", "3").description == descriptions[3]
        assert {a: int(v) for a, v in client.get_registered_model("edited").aliases.items()} \
            == {"production": 2}
        assert sync(reg.backend, uri).repaired == {}  # type: ignore[arg-type]

        # A version deleted in the UI comes back under its own number.
        client.delete_model_version("edited", "2")
        restored = sync(reg.backend, uri)  # type: ignore[arg-type]
        assert restored.repaired == {"edited:v2": ["restored"]}
        shown = {int(m.version): m.tags["registry.ref"]
                 for m in client.search_model_versions("name='edited'")}
        assert shown == {1: "edited:v1", 2: "edited:v2", 3: "edited:v3"}
        assert dict(client.get_model_version("edited", "2").tags) == expected[2]
        assert {a: int(v) for a, v in client.get_registered_model("edited").aliases.items()} \
            == {"production": 2}
        # And so does a whole registered model deleted there.
        client.delete_registered_model("edited")
        again = sync(reg.backend, uri)  # type: ignore[arg-type]
        assert sorted(again.repaired) == ["edited:v1", "edited:v2", "edited:v3"]
        assert sorted(int(m.version) for m in client.search_model_versions("name='edited'")) \
            == [1, 2, 3]
        assert sync(reg.backend, uri).repaired == {}  # type: ignore[arg-type]
    finally:
        reg.close()


def test_version_tags_name_store_objects_by_key_not_by_host_path(tmp_path: Path) -> None:
    reg = registry.Registry(home=tmp_path / "home")
    try:
        mv = reg.push(trained_mlp(), "keyed")
        record = reg.backend.resolve(registry.parse_ref("keyed:v1"))
    finally:
        reg.close()
    local = version_tags(record, f"file://{tmp_path}/home/objects/blobs/sha256/{mv.digest[7:]}")
    assert local["registry.blob_key"] == f"blobs/sha256/{mv.digest[7:]}"
    assert "registry.blob_uri" not in local
    assert not [v for v in local.values() if str(tmp_path) in v]
    remote = version_tags(record, f"s3://bucket/registry/blobs/sha256/{mv.digest[7:]}")
    assert remote["registry.blob_uri"] == f"s3://bucket/registry/blobs/sha256/{mv.digest[7:]}"


def test_embedded_sync_goes_to_registry_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(), "local-model", aliases=["production"])
    reg.close()
    result = run_cli("mlflow", "sync", env=clean_env(home), check=True)
    assert f"sqlite:///{home / 'mlflow.db'}" in result.stdout
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    mv = client.get_model_version("local-model", "1")
    assert mv.source.startswith("file://") and mv.tags["registry.devices"] == "cpu"
    assert mv.aliases == ["production"]


def test_pushing_and_importing_never_load_mlflow(tmp_path: Path) -> None:
    code = ("import sys, registry; from tests.helpers import trained_mlp; "
            "registry.push(trained_mlp(), 'light'); registry.pull_state_dict('light'); "
            "print(sorted(m for m in ('mlflow', 'fastapi', 'uvicorn') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], env=clean_env(tmp_path / "home"),
                            capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_mirror_state_migration_up_and_down_on_sqlite(tmp_path: Path) -> None:
    _migrate_round_trip(f"sqlite:///{tmp_path / 'catalog.db'}")


@pytest.mark.postgres
def test_mirror_state_migration_up_and_down_on_postgres(pg_url: str) -> None:
    _migrate_round_trip(pg_url)


def _migrate_round_trip(url: str) -> None:
    from sqlalchemy import inspect

    from registry.catalog.db import (
        current_revision,
        downgrade,
        head_revision,
        make_engine,
        upgrade,
    )

    engine = make_engine(url)
    try:
        upgrade(engine, "0002")
        columns = {c["name"] for c in inspect(engine).get_columns("registry_versions")}
        assert "mlflow_synced" in columns
        downgrade(engine, "0001")
        assert current_revision(engine) == "0001"
        columns = {c["name"] for c in inspect(engine).get_columns("registry_versions")}
        assert "mlflow_synced" not in columns
        upgrade(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_registry_ui_syncs_then_serves_mlflow(tmp_path: Path) -> None:
    home = tmp_path / "home"
    reg = registry.Registry(home=home)
    reg.push(trained_mlp(), "ui-model")
    reg.close()
    port = free_port()
    log = tmp_path / "ui.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*registry_exe(), "ui", "--port", str(port)], env=clean_env(home),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    service = Service(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_until_up(service, "/health", 120, "registry ui")
        assert "synced 1 version(s)" in service.output()
        mv = _version(service, "ui-model", 1)
        assert mv is not None and mv["tag_map"]["registry.ref"] == "ui-model:v1"
    finally:
        stop_group(service)


# -- version numbers as any MLflow release types them ---------------------------------------

@dataclass
class _Version:
    version: Any
    tags: dict[str, str] = field(default_factory=dict)


class _NumberingClient:
    """Stands in for MlflowClient's numbering only: MLflow <= 3.17 answers version numbers as
    strings, 3.18 as integers. Created versions count up and deletions never free a number."""

    def __init__(self, as_type: type) -> None:
        self.as_type = as_type
        self.next = 1
        self.deleted: list[Any] = []

    def create_model_version(self, name: str, **_: Any) -> _Version:
        created = _Version(self.as_type(self.next))
        self.next += 1
        return created

    def delete_model_version(self, name: str, version: Any) -> None:
        self.deleted.append(version)


@pytest.mark.parametrize("as_type", [str, int], ids=["mlflow<=3.17", "mlflow>=3.18"])
def test_placeholders_fill_gaps_whatever_type_versions_have(as_type: type) -> None:
    client = _NumberingClient(as_type)
    created = create_aligned(client, "m", 3, "s3://b/k", {"registry.ref": "m:v3"}, "")
    assert int(created.version) == 3
    assert [int(v) for v in client.deleted] == [1, 2]
