"""Lineage recorded at push inside the signed manifest: git, the active MLflow run, library
versions, parents (given, reused shards, an adapter's base), datasets and run; read back as a
graph whose children come from the catalog, also after `registry db rebuild`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

import registry
from registry import manifest as mf
from registry.errors import ManifestError, NotFoundError, RefError
from registry.provenance import lineage
from tests.helpers import block_lm, clean_env, run_cli, trained_mlp

SHARD = "16KiB"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    (root / "train.py").write_text("print('train')\n")
    _git(root, "add", "train.py")
    _git(root, "commit", "-q", "-m", "train")
    _git(root, "remote", "add", "origin", "https://alice:ghp_secret@example.com/org/repo.git")
    monkeypatch.chdir(root)
    return root


def test_a_push_in_a_git_repository_with_an_active_mlflow_run_records_both(
        reg: registry.Registry, repo: Path, tmp_path: Path) -> None:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        with mlflow.start_run() as run:
            mv = reg.push(trained_mlp(), "mlp")
    finally:
        mlflow.set_tracking_uri(None)
    found = reg.lineage(mv.ref)
    assert found.git == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False,
                         "remote": "https://example.com/org/repo.git"}
    assert found.mlflow == {"run_id": run.info.run_id,
                            "experiment_id": run.info.experiment_id,
                            "tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    assert found.libraries["torch"] == torch.__version__.split("+")[0] or \
        found.libraries["torch"] == torch.__version__
    assert set(found.libraries) >= {"torch", "safetensors", "registry"}
    # Recorded in the manifest the store keeps (and a signature covers), credentials nowhere.
    stored = (reg.settings.home / "objects" / mf.manifest_key("mlp", 1)).read_bytes()
    assert b"ghp_secret" not in stored and b"alice" not in stored
    assert mf.loads(stored, origin="mlp:v1")["source"]["lineage"]["git"] == found.git
    assert mv.metadata["source"]["lineage"]["mlflow"]["run_id"] == run.info.run_id

    (repo / "train.py").write_text("print('changed')\n")  # a tracked file edited: dirty
    assert reg.lineage(reg.push(trained_mlp(1), "mlp").ref).git["dirty"] is True  # type: ignore[index]


def test_without_an_active_run_or_a_repository_nothing_is_made_up(
        reg: registry.Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    found = reg.lineage(reg.push(trained_mlp(), "mlp").ref)
    assert found.git is None and found.mlflow is None and found.parents == []


def test_each_capture_has_its_switch_and_lineage_0_turns_all_off(
        home: Path, repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_LINEAGE_GIT", "0")
    reg = registry.Registry(home=home)
    found = reg.lineage(reg.push(trained_mlp(), "mlp").ref)
    assert found.git is None and "torch" in found.libraries

    monkeypatch.setenv("REGISTRY_LINEAGE_GIT", "1")
    monkeypatch.setenv("REGISTRY_LINEAGE", "0")
    reg = registry.Registry(home=home)
    mv = reg.push(trained_mlp(), "mlp", datasets=[{"name": "d", "uri": "file:///d"}])
    found = reg.lineage(mv.ref)
    # Nothing captured by itself (not even the reused previous version); what was given stays.
    assert (found.git, found.libraries, found.parents) == (None, {}, [])
    assert found.datasets == [{"name": "d", "uri": "file:///d"}]
    monkeypatch.setenv("REGISTRY_LINEAGE_MLFLOW", "maybe")
    with pytest.raises(registry.errors.SettingsError, match="REGISTRY_LINEAGE_MLFLOW"):
        registry.Registry(home=home)


def test_given_parents_datasets_and_run_and_the_graph_both_ways(
        reg: registry.Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    base = reg.push(block_lm(), "lm", shard_size=SHARD)
    other = reg.push(trained_mlp(), "mlp")
    tuned = block_lm()
    with torch.no_grad():
        tuned.layers[-1].mlp.weight.add_(0.5)
    digest = "sha256:" + "ab" * 32
    child = reg.push(tuned, "lm", shard_size=SHARD, parents=["mlp"],
                     datasets=[{"name": "wiki", "uri": "s3://u:pw@data/wiki", "digest": digest}],
                     run={"id": "r1", "uri": "https://ci.example.com/runs/1"})
    found = reg.lineage(child.ref)
    relations = {(p.ref, p.relation) for p in found.parents}
    # The version whose shards it reused, and the parent it was given, by digest.
    assert relations == {("lm:v1", "reused-shards"), ("mlp:v1", "given")}
    assert {p.digest for p in found.parents} == {base.digest, other.digest}
    assert found.datasets == [{"name": "wiki", "uri": "s3://data/wiki", "digest": digest}]
    assert found.run == {"id": "r1", "uri": "https://ci.example.com/runs/1"}
    assert [c.ref for c in reg.lineage("lm:v1").children] == ["lm:v2"]
    assert [c.ref for c in reg.lineage("mlp:v1").children] == ["lm:v2"]

    # The catalog rebuilt from the store knows the same graph.
    reg.backend.rebuild()  # type: ignore[attr-defined]
    assert [c.ref for c in reg.lineage("mlp:v1").children] == ["lm:v2"]
    assert reg.lineage("lm:v2").to_dict()["parents"] == found.to_dict()["parents"]


def test_what_is_given_is_checked_before_anything_is_written(reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "mlp")
    with pytest.raises(NotFoundError, match="nope"):
        reg.push(trained_mlp(1), "mlp", parents=["nope:v3"])
    with pytest.raises(RefError):
        reg.push(trained_mlp(1), "mlp", parents=["not a ref!"])
    with pytest.raises(RefError, match="datasets\\[0\\].uri"):
        reg.push(trained_mlp(1), "mlp", datasets=[{"name": "d"}])
    with pytest.raises(RefError, match="datasets\\[0\\] has key 'size'"):
        reg.push(trained_mlp(1), "mlp", datasets=[{"name": "d", "uri": "x", "size": 1}])
    with pytest.raises(RefError, match="digest"):
        reg.push(trained_mlp(1), "mlp", datasets=[{"name": "d", "uri": "x", "digest": "nope"}])
    with pytest.raises(RefError, match="at most"):
        reg.push(trained_mlp(1), "mlp", datasets=[{"name": "d", "uri": "x" * 5000}])
    with pytest.raises(RefError, match="at most 64"):
        reg.push(trained_mlp(1), "mlp", datasets=[{"name": f"d{i}", "uri": "x"}
                                                  for i in range(65)])
    with pytest.raises(RefError, match="run has key"):
        reg.push(trained_mlp(1), "mlp", run={"name": "x"})
    assert [v.version for v in reg.list_versions("mlp")] == [1]


def test_old_manifests_without_lineage_read_and_a_bad_record_is_refused(
        reg: registry.Registry) -> None:
    mv = reg.push(trained_mlp(), "mlp", datasets=[{"name": "d", "uri": "x"}])
    manifest = json.loads(json.dumps({k: v for k, v in mv.metadata.items()
                                      if k in mf.TOP_LEVEL_KEYS}))
    del manifest["source"]["lineage"]
    assert mf.validate(manifest, origin="old") is manifest  # as written before lineage
    for bad in ({"parents": [{"name": "x"}]}, {"git": {"commit": "zz", "dirty": False}},
                {"datasets": [{"name": "d", "uri": "x" * 5000}]}, {"owner": "me"}, []):
        manifest["source"]["lineage"] = bad
        with pytest.raises(ManifestError, match="source.lineage"):
            mf.validate(manifest, origin="bad")


def test_credentials_are_stripped_from_urls() -> None:
    assert lineage.strip_credentials("https://u:p@h.example/x?y=1") == "https://h.example/x?y=1"
    assert lineage.strip_credentials("git@github.com:org/repo.git") == \
        "git@github.com:org/repo.git"
    assert lineage.parse_dataset("d=s3://b/k@sha256:" + "0" * 64)["digest"] == \
        "sha256:" + "0" * 64
    assert lineage.parse_dataset("d=https://u@h/x") == {"name": "d", "uri": "https://h/x"}


def test_cli_push_with_parent_dataset_and_run_then_lineage_json(
        home: Path, tmp_path: Path) -> None:
    env = clean_env(home)
    ckpt = tmp_path / "m.safetensors"
    from safetensors.torch import save_file

    save_file(trained_mlp().state_dict(), str(ckpt))
    run_cli("push", "mlp", str(ckpt), env=env, cwd=tmp_path, check=True)
    run_cli("push", "tuned", str(ckpt), "--parent", "mlp:v1", "--dataset",
            "wiki=s3://data/wiki@sha256:" + "1" * 64, "--run", "runs:/abc123/model",
            env=env, cwd=tmp_path, check=True)
    out = json.loads(run_cli("lineage", "tuned", "--json", env=env, cwd=tmp_path,
                             check=True).stdout)
    assert [p["ref"] for p in out["parents"]] == ["mlp:v1"]
    assert out["run"] == {"uri": "runs:/abc123/model", "id": "abc123"}
    assert out["datasets"][0]["digest"] == "sha256:" + "1" * 64
    text = run_cli("lineage", "mlp:v1", env=env, cwd=tmp_path, check=True).stdout
    assert "child      tuned:v1" in text
    missing = run_cli("push", "x", str(ckpt), "--parent", "ghost:v1", env=env, cwd=tmp_path)
    assert missing.returncode == 3 and "ghost" in missing.stderr
