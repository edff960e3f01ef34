"""Store objects are untrusted: `registry db rebuild` checks every key and manifest before it
restores any, refuses the whole rebuild with a CheckpointError naming the object (the catalog is
left as it was), and never imports a name that fails the grammar.

Decision: refuse, not skip. A rebuild that silently left out a tampered version would retire or
reuse its number without anyone noticing; the message names the object to remove or repair.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import registry
from registry import manifest as mf
from registry.errors import CheckpointError
from tests.helpers import clean_env, run_cli, trained_mlp


def _objects(reg: registry.Registry) -> Path:
    return reg.settings.home / "objects"


def _manifest(reg: registry.Registry, name: str = "m", version: int = 1) -> dict[str, Any]:
    """A stored manifest without its checksum: someone who can write the store can also drop
    or recompute a checksum, so these tests reach the checks behind it."""
    data: dict[str, Any] = json.loads(
        (_objects(reg) / "manifests" / name / f"v{version}.json").read_text())
    data.pop(mf.CHECKSUM_KEY)
    return data


def _write(reg: registry.Registry, key: str, content: bytes | dict[str, Any] | list[Any]) -> None:
    path = _objects(reg) / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())


def _refused(reg: registry.Registry, match: str) -> str:
    before = {n: [v.ref for v in reg.list_versions(n)] for n in reg.list_models()}
    with pytest.raises(CheckpointError, match=match) as caught:
        reg.backend.rebuild()
    assert len(str(caught.value)) < 800
    after = {n: [v.ref for v in reg.list_versions(n)] for n in reg.list_models()}
    assert after == before, "a refused rebuild changed the catalog"
    return str(caught.value)


@pytest.fixture
def seeded(reg: registry.Registry) -> registry.Registry:
    reg.push(trained_mlp(), "m", aliases=["prod"])
    reg.push(trained_mlp(1), "m")
    assert reg.backend.rebuild() == 2  # a clean store rebuilds
    return reg


def _tampered(seeded: registry.Registry, **changes: Any) -> dict[str, Any]:
    manifest = _manifest(seeded)
    manifest.update(changes)
    return manifest


BAD_MANIFESTS = {
    "name traversal": (lambda r: _tampered(r, name="../../evil"), "invalid model name"),
    "other model": (lambda r: _tampered(r, name="other"), "names model"),
    "version true": (lambda r: _tampered(r, version=True), "integer"),
    "version mismatch": (lambda r: _tampered(r, version=7), "not 1"),
    "digest traversal": (lambda r: _tampered(r, digest="sha256:../../../victim"), "digest"),
    "no source": (lambda r: {k: v for k, v in _manifest(r).items() if k != "source"},
                  "source"),
    "size a string": (lambda r: _tampered(r, source={"size_bytes": "12"}), "size_bytes"),
    "bad created_at": (lambda r: _tampered(r, created_at="yesterday"), "ISO 8601"),
    "tags a list": (lambda r: _tampered(r, tags=["x"]), "tags"),
    "huge tag": (lambda r: _tampered(r, tags={"k": "x" * 10_000}), "tag"),
    "format_version a string": (lambda r: _tampered(r, format_version="1"), "format_version"),
    "an unknown key": (lambda r: _tampered(r, factory="os:system"), "top-level key"),
    "tensor_count off by one": (lambda r: _tampered(r, tensor_count=_manifest(r)["tensor_count"]
                                                   + 1), "tensor_count"),
    "a JSON list": (lambda r: [], "expected a JSON object"),
    "not JSON": (lambda r: b"{not json", "not valid JSON"),
    "empty": (lambda r: b"", "not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_MANIFESTS), ids=list(BAD_MANIFESTS))
def test_tampered_manifests_refuse_the_rebuild(seeded: registry.Registry, case: str) -> None:
    make, match = BAD_MANIFESTS[case]
    _write(seeded, "manifests/m/v1.json", make(seeded))
    message = _refused(seeded, match)
    assert "manifests/m/v1.json" in message


def test_a_manifest_changed_under_its_checksum_refuses_the_rebuild(
        seeded: registry.Registry) -> None:
    stored = json.loads((_objects(seeded) / "manifests/m/v1.json").read_text())
    stored["architecture"]["class"] = "tests.helpers:Evil"  # still passes the schema
    _write(seeded, "manifests/m/v1.json", stored)
    message = _refused(seeded, "does not match its checksum")
    assert "manifests/m/v1.json" in message


def test_a_changed_byte_in_the_checksum_key_name_refuses_the_rebuild(
        seeded: registry.Registry) -> None:
    """Found by tests/faults: ``manifest_sha256`` -> ``manife{t_sha256`` once read as a manifest
    with no checksum plus a key nobody reads, and the rebuild took it."""
    path = _objects(seeded) / "manifests/m/v1.json"
    good = path.read_bytes()
    at = good.index(mf.CHECKSUM_KEY.encode())
    for i in range(len(mf.CHECKSUM_KEY)):
        data = bytearray(good)
        data[at + i] ^= 0x10
        path.write_bytes(bytes(data))
        message = _refused(seeded, "top-level key|not valid JSON")  # a "2" flips to a quote
        assert "manifests/m/v1.json" in message
    path.write_bytes(good)
    assert seeded.backend.rebuild() == 2


@pytest.mark.parametrize("key", ["manifests/EVIL/v1.json", "manifests/a b/v1.json",
                                 "manifests/m/v0.json", "manifests/m/v99999999999.json",
                                 "manifests/m/latest.json", "manifests/m/nested/v1.json",
                                 "manifests/stray.json"])
def test_keys_that_name_no_version_refuse_the_rebuild(seeded: registry.Registry,
                                                      key: str) -> None:
    _write(seeded, key, _manifest(seeded))
    _refused(seeded, "is not manifests/<name>/v<N>")


@pytest.mark.parametrize("table", [{"Prod": 1}, {"latest": 1}, {"prod": True}, {"prod": "1"},
                                   {"prod": 2**31}, ["prod"], b"{", b"null"])
def test_bad_alias_tables_refuse_the_rebuild(seeded: registry.Registry, table: Any) -> None:
    _write(seeded, "aliases/m.json", table)
    _refused(seeded, "alias table|not valid JSON")


def test_alias_table_under_a_bad_name_refuses_the_rebuild(seeded: registry.Registry) -> None:
    _write(seeded, "aliases/../x.json", {"prod": 1})  # lands at objects/x.json: not listed
    _write(seeded, "aliases/Bad.json", {"prod": 1})
    _refused(seeded, "aliases/<name>.json")
    (_objects(seeded) / "x.json").unlink()


@pytest.mark.s3
def test_an_s3_key_climbing_out_of_manifests_is_refused(s3_store_url: str, raw_s3: Any,
                                                        s3_bucket: str, home: Path) -> None:
    """On S3 a key is any string: ``manifests/../../evil/v1.json`` can exist. It must never
    become a model named ``../../evil``."""
    reg = registry.Registry(home=home, store=s3_store_url)
    try:
        reg.push(trained_mlp(), "m")
        manifest = json.loads(raw_s3.get_object(Bucket=s3_bucket,
                                                Key="team/manifests/m/v1.json")["Body"].read())
        manifest["name"] = "../../evil"
        raw_s3.put_object(Bucket=s3_bucket, Key="team/manifests/../../evil/v1.json",
                          Body=json.dumps(manifest).encode())
        keys = [o["Key"] for o in raw_s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
        assert "team/manifests/../../evil/v1.json" in keys, keys
        _refused(reg, "is not manifests/<name>/v<N>")
        assert reg.list_models() == ["m"]
    finally:
        reg.close()


def test_cli_rebuild_of_a_malformed_store_is_one_line(seeded: registry.Registry,
                                                      home: Path) -> None:
    _write(seeded, "manifests/m/v2.json", b"\x00\xff garbage")
    env = clean_env(home)
    result = run_cli("db", "rebuild", env=env)
    assert result.returncode == CheckpointError.exit_code, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert "manifests/m/v2.json" in result.stderr
    listing = run_cli("ls", "m", env=env)
    assert listing.returncode == 0 and "m:v2" in listing.stdout
