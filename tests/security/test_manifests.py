"""Manifests are untrusted: a schema check before use, and the version digest recomputed from
the files a manifest lists, so an edited catalog row or store object never swaps weights."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import text

from registry import DigestMismatchError, ManifestError, Registry
from registry import manifest as mf
from registry.io.digests import sha256_bytes
from tests.helpers import block_lm, trained_mlp


def _edit_catalog(reg: Registry, name: str, version: int, **columns: str) -> None:
    sets = ", ".join(f"{k} = :{k}" for k in columns)
    with reg._backend.catalog.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(text(f"UPDATE registry_versions SET {sets} WHERE version = :v AND model_id ="
                          " (SELECT id FROM registry_models WHERE name = :n)"),
                     {**columns, "v": version, "n": name})


def _manifest(reg: Registry, ref: str) -> dict[str, Any]:
    return copy.deepcopy(reg.show(ref).metadata) | {"tags": reg.show(ref).tags}


def test_files_pointed_at_another_models_blob_are_refused(reg: Registry) -> None:
    victim = reg.push(trained_mlp(0), "victim")
    other = reg.push(trained_mlp(1), "other")
    manifest = _manifest(reg, "victim")
    manifest["files"][0]["digest"] = other.digest
    _edit_catalog(reg, "victim", 1, manifest=json.dumps(manifest))
    with pytest.raises(DigestMismatchError, match="tampered"):
        reg.pull_state_dict("victim", device="cpu")
    # Consistently edited (files and digest), it still disagrees with the version's digest.
    manifest["digest"] = other.digest
    _edit_catalog(reg, "victim", 1, manifest=json.dumps(manifest))
    with pytest.raises(DigestMismatchError, match=f"recorded with digest {victim.digest}"):
        reg.pull("victim", device="cpu", model=type(trained_mlp()))
    assert reg.show("victim").digest == victim.digest


def test_a_manifest_edited_after_warm_pulls_is_refused(reg: Registry) -> None:
    """Pulls check each manifest text once and keep the catalog's row while it is unchanged;
    neither lets an edit made after them through."""
    victim = reg.push(trained_mlp(0), "victim")
    other = reg.push(trained_mlp(1), "other")
    for _ in range(3):
        reg.pull_state_dict("victim", device="cpu")
    manifest = _manifest(reg, "victim")
    manifest["files"][0]["digest"] = manifest["digest"] = other.digest
    _edit_catalog(reg, "victim", 1, manifest=json.dumps(manifest))
    with pytest.raises(DigestMismatchError, match=f"recorded with digest {victim.digest}"):
        reg.pull_state_dict("victim", device="cpu")
    manifest["format_version"] = 99
    _edit_catalog(reg, "victim", 1, manifest=json.dumps(manifest))
    with pytest.raises(ManifestError, match="format_version 99"):
        reg.pull_state_dict("victim", device="cpu")


def test_a_manifest_that_lists_other_tensors_than_its_blob_is_refused(reg: Registry) -> None:
    reg.push(trained_mlp(), "m")
    original = _manifest(reg, "m")
    manifest = copy.deepcopy(original)
    spec = manifest["tensors"].pop("fc1.weight")
    manifest["tensors"]["fc9.weight"] = spec
    manifest["files"][0]["tensors"] = sorted(manifest["tensors"])
    manifest["key_order"] = ["fc9.weight" if k == "fc1.weight" else k
                             for k in manifest["key_order"]]
    _edit_catalog(reg, "m", 1, manifest=json.dumps(manifest))
    with pytest.raises(ManifestError, match="holds other tensors than its manifest lists"):
        reg.pull_state_dict("m", device="cpu")
    _edit_catalog(reg, "m", 1, manifest=json.dumps(_manifest_with_shape(original)))
    with pytest.raises(ManifestError, match="'fc1.weight' is stored as torch.float32"):
        reg.pull_state_dict("m", device="cpu")


def _manifest_with_shape(manifest: dict[str, Any]) -> dict[str, Any]:
    original = copy.deepcopy(manifest)
    original["tensors"]["fc1.weight"]["shape"] = [1, 128]
    return original


@pytest.mark.parametrize("breakage,message", [
    (lambda m: m.pop("files"), "files is None"),
    (lambda m: m.update(files=[]), "files is \\[\\]"),
    (lambda m: m.pop("source"), "source is None"),
    (lambda m: m["source"].update(tied={"head.weight": "nowhere.weight"}), "source.tied"),
    (lambda m: m["tensors"]["fc1.weight"].update(dtype="object"), "dtype is 'object'"),
    (lambda m: m["tensors"]["fc1.weight"].update(shape=[-1]), "shape is \\[-1\\]"),
    (lambda m: m["files"][0].update(digest="sha256:../../../../victim"), "invalid"),
    (lambda m: m["files"][0].update(size=True), "size is True"),
    (lambda m: m["files"][0]["tensors"].append("fc1.weight"), "exactly one shard"),
    (lambda m: m["files"][0]["tensors"].remove("fc1.weight"), "one of the files holds"),
    (lambda m: m.update(version=2**40), "version is"),
    (lambda m: m.update(name="../../evil"), "invalid model name"),
    (lambda m: m.update(format_version=True), "format_version"),
    (lambda m: m.update(format_version=4), "newer than this registry"),
    (lambda m: m.update(attachments=[{"name": "../x", "digest": "sha256:" + "0" * 64,
                                      "size": 1}]), "invalid file name"),
    (lambda m: m.update(tags={"k": "v" * 10**6}), None),
    (lambda m: m.update(module_metadata=[["bn", 2]]), "module_metadata is"),
    (lambda m: m["module_metadata"].update(bn={"version": "2"}), "module_metadata\\['bn'\\]"),
    (lambda m: m["module_metadata"].update(bn={"version": 2, "hook": "os:system"}),
     "module_metadata\\['bn'\\]"),
    (lambda m: m["module_metadata"].update(bn={"version": 2**40}), "from 0 to 2147483647"),
    (lambda m: m["module_metadata"].update(bn={"version": True}), "module_metadata"),
    (lambda m: m["module_metadata"].update({"x" * 5000: {"version": 1}}), "module prefix"),
    (lambda m: m.update(key_order="fc1.weight"), "key_order is 'fc1.weight'"),
    (lambda m: m["key_order"].pop(), "key_order is"),
    (lambda m: m["key_order"].__setitem__(0, m["key_order"][1]), "listed once"),
    (lambda m: m["key_order"].__setitem__(0, "evil.weight"), "key_order is 'evil.weight'"),
    (lambda m: m["key_order"].__setitem__(0, {"$ref": 1}), "key_order"),
])
def test_schema_faults_are_named_and_never_used(reg: Registry, breakage: Any,
                                                message: str | None) -> None:
    reg.push(trained_mlp(), "m")
    manifest = _manifest(reg, "m")
    breakage(manifest)
    if message is None:  # a huge but valid value: accepted, and never echoed whole
        mf.validate(manifest, origin="test")
        return
    with pytest.raises(ManifestError, match=message) as err:
        mf.validate(manifest, origin="test")
    assert len(str(err.value)) < 600
    _edit_catalog(reg, "m", 1, manifest=json.dumps(manifest))
    with pytest.raises(ManifestError):
        reg.pull_state_dict("m", device="cpu")


def test_rebuild_refuses_a_tampered_store_manifest(reg: Registry) -> None:
    reg.push(block_lm(), "lm", shard_size="16KiB")
    other = reg.push(trained_mlp(), "other")
    key = reg.settings.home / "objects" / "manifests" / "lm" / "v1.json"
    manifest = json.loads(key.read_text())
    manifest["files"][0]["digest"] = other.digest
    key.write_text(json.dumps(manifest))
    with pytest.raises((DigestMismatchError, ManifestError)):
        reg._backend.rebuild()  # type: ignore[attr-defined]


def test_version_digest_of_several_shards_is_the_hash_of_their_list(reg: Registry,
                                                                     tmp_path: Path) -> None:
    mv = reg.push(block_lm(), "lm", shard_size="16KiB")
    digests = [f["digest"] for f in mv.metadata["files"]]
    assert len(digests) > 1
    assert mv.digest == sha256_bytes(json.dumps(digests, separators=(",", ":")).encode())
    assert reg.show(f"lm@{mv.digest}").version == 1
    assert torch.equal(reg.pull_state_dict("lm", device="cpu")["embed.weight"],
                       block_lm().embed.weight)
