"""Reads from outside are as strict as their format: the store's shard reader refuses what
safetensors refuses; every JSON the registry reads from outside (model folders, `db rebuild`,
memo files, server answers, shard headers) is parsed with a depth bound; and each failure is a
typed RegistryError, never SafetensorError, RuntimeError, RecursionError or a traceback."""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import safe_open, save_file

import registry
from registry.errors import CheckpointError, ManifestError, RegistryError
from registry.io.weights import load_shard
from tests.helpers import MLP, clean_env, run_cli, trained_mlp

from .hostile import HostileServer

DEEP = "[" * 100_000 + "]" * 100_000


def _shard(path: Path, header: bytes, data: bytes = b"\0" * 8) -> Path:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def _header(key: str = "w", dtype: str = "F32", metadata: Any = None,
            shape: list[int] | None = None) -> dict[str, Any]:
    head: dict[str, Any] = {key: {"dtype": dtype, "shape": shape or [2],
                                  "data_offsets": [0, 8]}}
    if metadata is not None:
        head["__metadata__"] = metadata
    return head


def _load(path: Path, key: str = "w") -> dict[str, torch.Tensor]:
    return load_shard(path, {key: {"dtype": "float32", "shape": [2]}},
                      lambda _k: torch.device("cpu"), lambda _k, d, _v: d, origin="m:v1")


REFUSED_BY_SAFETENSORS = {
    "a UTF-8 BOM": ("w", b"\xef\xbb\xbf" + json.dumps(_header()).encode()),
    "UTF-16": ("w", json.dumps(_header()).encode("utf-16-le")),
    "a lone surrogate key": ("\ud800", json.dumps(_header("\ud800")).encode()),
    "metadata not strings": ("w", json.dumps(_header(metadata={"format": 1})).encode()),
}


@pytest.mark.parametrize("case", list(REFUSED_BY_SAFETENSORS))
def test_the_store_reader_refuses_what_safetensors_refuses(work: Path, case: str) -> None:
    key, header = REFUSED_BY_SAFETENSORS[case]
    path = _shard(work / "shard", header)
    # The premise: safetensors refuses this file.
    with pytest.raises(SafetensorError), safe_open(str(path), framework="pt") as f:
        f.get_tensor(key)
    with pytest.raises(ManifestError, match="not a valid safetensors file"):
        _load(path, key)


@pytest.mark.parametrize("header", [
    _header(dtype="X9"),  # a dtype neither reader knows
    _header(dtype="U16", shape=[2**40, 2**40, 2**40]),  # a shape product past 64 bits
], ids=["unknown dtype", "overflowing shape"])
def test_crafted_shards_are_typed_errors(work: Path, header: dict[str, Any]) -> None:
    path = _shard(work / "shard", json.dumps(header).encode())
    with pytest.raises(ManifestError, match="not a valid safetensors file"):
        _load(path)


def test_a_100000_deep_header_is_a_typed_error(work: Path) -> None:
    path = _shard(work / "shard", ('{"w": ' + DEEP + "}").encode())
    with pytest.raises(ManifestError, match="not a valid safetensors file"):
        _load(path)


def test_a_deep_config_in_a_pushed_folder_is_typed(reg: registry.Registry, work: Path) -> None:
    folder = work / "model"
    folder.mkdir()
    save_file(trained_mlp().state_dict(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"architectures": ' + DEEP + "}")
    with pytest.raises(CheckpointError, match="config.json"):
        reg.push(folder, "m")


def test_a_deep_stored_manifest_refuses_the_rebuild(reg: registry.Registry, home: Path) -> None:
    reg.push(trained_mlp(), "m")
    (home / "objects" / "manifests" / "m" / "v1.json").write_text(DEEP)
    with pytest.raises(CheckpointError, match="manifests/m/v1.json"):
        reg.backend.rebuild()


def test_a_deep_memo_file_is_ignored(reg: registry.Registry) -> None:
    reg.push(trained_mlp(), "m")
    memos = list((reg.settings.cache_dir / "verified").iterdir())
    assert memos
    for memo in memos:
        memo.write_text(DEEP)
    fresh = registry.Registry(home=reg.settings.home)
    assert set(fresh.pull_state_dict("m", device="cpu")) == set(trained_mlp().state_dict())
    fresh.close()


def test_a_deep_server_answer_is_typed(hostile: HostileServer,
                                       hostile_client: registry.Registry) -> None:
    hostile.answer("GET", "/api/v1/resolve", DEEP.encode(), raw=True)
    with pytest.raises(RegistryError, match="not JSON"):
        hostile_client.show("m")
    hostile.answer("GET", "/api/v1/resolve", ('{"error": ' + DEEP + "}").encode(), raw=True,
                   status=400)
    with pytest.raises(RegistryError, match="HTTP 400"):
        hostile_client.show("m")


@pytest.mark.parametrize("row", ['{"format": "onnx"}', "{not json", '{"digest": 1}'])
def test_a_malformed_catalog_export_row_is_one_line(reg: registry.Registry, home: Path,
                                                    row: str) -> None:
    reg.push(trained_mlp(), "m", factory=MLP)
    reg.export("m", format="torchscript", input_shapes=[(2, 8)])
    with sqlite3.connect(home / "registry.db") as db:
        db.execute("UPDATE registry_exports SET record = ?", (row,))
    with pytest.raises(ManifestError):
        reg.list_exports("m")
    result = run_cli("show", "m", env=clean_env(home))
    assert result.returncode == ManifestError.exit_code, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_a_deep_signature_list_in_the_store_refuses_the_rebuild(reg: registry.Registry,
                                                                home: Path) -> None:
    """The store's ``.signatures.json`` was parsed with plain ``json.loads``: 100,000 brackets
    raised a raw RecursionError out of `db rebuild` (and of every pull of the version)."""
    from registry.signing import records

    reg.push(trained_mlp(), "m")
    (home / "objects" / records.store_key("m", 1)).write_text(DEEP)
    with pytest.raises(ManifestError, match="not valid JSON"):
        records.loads(DEEP.encode(), "m", 1, records.store_key("m", 1))
    with pytest.raises(RegistryError, match="signatures.json"):
        reg.backend.rebuild()


def test_deep_bundles_and_oci_manifests_are_typed() -> None:
    """A signature bundle and an OCI manifest come from outside and were parsed with plain
    ``json.loads``: each raised a raw RecursionError."""
    from registry.errors import OciArtifactError, SignatureError
    from registry.oci import modelpack
    from registry.signing import oms

    with pytest.raises(SignatureError, match="not an OMS"):
        oms.facts(DEEP.encode()[: oms.MAX_BUNDLE_BYTES], "m:v1")
    with pytest.raises(OciArtifactError, match="not a JSON manifest"):
        modelpack.read(DEEP.encode(), "application/vnd.oci.image.manifest.v1+json",
                       origin="oci://127.0.0.1/m:v1", max_bytes=1 << 30)
