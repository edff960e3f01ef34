"""Export records are untrusted wherever they are read back: a store's
``manifests/<name>/v<N>.exports.json`` (a hostile one refuses `db rebuild` and changes nothing)
and a server's export answers (a hostile one is refused before it names a file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import registry
from registry.errors import CheckpointError, RegistryError
from registry.exports import records
from tests.helpers import MLP, trained_mlp

from .hostile import HostileServer

DIGEST = "sha256:" + "a" * 64


@pytest.fixture
def exported(reg: registry.Registry) -> tuple[registry.Registry, dict[str, Any]]:
    reg.push(trained_mlp(), "m", factory=MLP)
    reg.export("m", format="torchscript", input_shapes=[(2, 8)])
    path = reg.settings.home / "objects" / records.store_key("m", 1)
    return reg, json.loads(path.read_bytes())


@pytest.mark.parametrize("case", ["traversal digest", "other version", "not json", "extra field",
                                  "unknown format"])
def test_a_tampered_exports_file_refuses_the_rebuild(
        exported: tuple[registry.Registry, dict[str, Any]], case: str) -> None:
    reg, stored = exported
    (record,) = stored["exports"]
    content: bytes | dict[str, Any] = {
        "traversal digest": {**stored, "exports": [{**record, "digest": "sha256:../../x"}]},
        "other version": {**stored, "version": 2},
        "not json": b"{",
        "extra field": {**stored, "exports": [{**record, "run": "os.system"}]},
        "unknown format": {**stored, "exports": [{**record, "format": "pickle"}]},
    }[case]
    path = reg.settings.home / "objects" / records.store_key("m", 1)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    before = [a.digest for a in reg.list_exports("m:v1")]
    with pytest.raises(CheckpointError, match=r"manifests/m/v1\.exports\.json|export record"):
        reg.backend.rebuild()
    assert [a.digest for a in reg.list_exports("m:v1")] == before == [record["digest"]]


def _version(server: HostileServer) -> None:
    manifest = {"format_version": 2, "name": "m", "version": 1, "digest": DIGEST,
                "created_at": "2026-01-01T00:00:00+00:00",
                "files": [{"digest": DIGEST, "size": 4, "format": "safetensors",
                           "tensors": ["w"]}],
                "tensors": {"w": {"dtype": "float32", "shape": [1]}},
                "source": {"size_bytes": 4, "tied": {}}}
    server.answer("GET", "/api/v1/resolve", {"name": "m", "version": 1, "digest": DIGEST,
                                             "size_bytes": 4, "manifest": manifest,
                                             "tags": {}, "aliases": []})


@pytest.mark.parametrize("answer", [
    {"exports": [{"format": "onnx", "digest": "sha256:../../../victim"}]},
    {"exports": "all of them"},
    {"exports": [{**dict.fromkeys(records.FIELDS, 1)}]},
    {"nothing": []},
])
def test_hostile_export_lists_are_refused(tmp_path: Path, answer: Any) -> None:
    server = HostileServer()
    try:
        _version(server)
        server.answer("GET", "/api/v1/models/m/versions/1/exports", answer)
        client = registry.Registry(server.url, home=tmp_path / "client")
        with pytest.raises(RegistryError, match="malformed export list|export record"):
            client.list_exports("m:v1")
        client.close()
    finally:
        server.close()
