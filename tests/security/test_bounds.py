"""Bounds on what comes in: a download stops at the manifest's size; gc skips (and counts)
objects under ``blobs/`` it does not understand; the push-begin route checks its file list; a
link in a pushed folder is followed only inside the folder or a Hugging Face cache's blobs/."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from safetensors.torch import save_file

import registry
from registry.errors import DigestMismatchError, NormalizationError
from tests.helpers import clean_env, run_cli, trained_mlp
from tests.integration.serving import Service

from .hostile import HostileServer
from .test_server_answers import DIGEST, _record


def test_a_download_stops_at_the_manifests_size(hostile: HostileServer,
                                                hostile_client: registry.Registry) -> None:
    hostile.answer("GET", "/api/v1/resolve", _record())
    hostile.answer("GET", f"/api/v1/blobs/{DIGEST}/link",
                   {"url": f"/api/v1/blobs/{DIGEST}", "direct": False})
    hostile.answer("GET", f"/api/v1/blobs/{DIGEST}", b"\0" * (8 << 20), raw=True,
                   content_type="application/octet-stream")
    with pytest.raises(DigestMismatchError, match="more than the 4 bytes"):
        hostile_client.pull_state_dict("m", device="cpu")


STRAYS = ["blobs/stray", "blobs/sha256/not-hex", "blobs/sha256/" + "a" * 64 + "/x",
          "blobs/md5/" + "b" * 32]


def test_gc_skips_and_counts_objects_it_does_not_understand(reg: registry.Registry,
                                                            home: Path) -> None:
    reg.push(trained_mlp(), "m")
    objects = home / "objects"
    for key in STRAYS:
        (objects / key).parent.mkdir(parents=True, exist_ok=True)
        (objects / key).write_bytes(b"stray")
    report = reg.gc()
    assert report.unknown == len(STRAYS)
    assert all((objects / key).exists() for key in STRAYS)
    result = run_cli("gc", env=clean_env(home))
    assert result.returncode == 0, result.stderr
    assert f"skipped {len(STRAYS)} object(s)" in result.stdout


def _file(role: str, name: str, data: bytes = b"x") -> dict[str, object]:
    return {"role": role, "name": name, "size": len(data),
            "digest": "sha256:" + hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("files", [
    [_file("file", "tokenizer.json")],
    [_file("weights", "model.safetensors"), _file("file", "a.json"), _file("file", "a.json", b"y")],
    [_file("weights", "model.safetensors"), _file("weights", "model.safetensors", b"y")],
], ids=["only attached files", "a name twice", "a shard name twice"])
def test_push_begin_refuses_a_file_list_that_makes_no_version(server: Service,
                                                              files: list[object]) -> None:
    answer = httpx.post(f"{server.url}/api/v1/models/listed/pushes", json={"files": files})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_manifest"


def _folder(work: Path) -> Path:
    folder = work / "model"
    folder.mkdir()
    save_file(trained_mlp().state_dict(), str(folder / "model.safetensors"))
    return folder


def test_a_link_out_of_a_pushed_folder_is_refused(reg: registry.Registry, work: Path) -> None:
    folder = _folder(work)
    (folder / "tokenizer.json").symlink_to(work.parent / "outside" / "secret.txt")
    with pytest.raises(NormalizationError, match="tokenizer.json.*outside the folder"):
        reg.push(folder, "m")
    assert reg.list_models() == []


def test_links_of_a_hugging_face_cache_snapshot_are_followed(reg: registry.Registry,
                                                            work: Path) -> None:
    repo = work / "hub" / "models--org--m"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    save_file(trained_mlp().state_dict(), str(repo / "blobs" / "w"))
    (repo / "blobs" / "t").write_text('{"tokens": 1}')
    (snapshot / "model.safetensors").symlink_to("../../blobs/w")
    (snapshot / "tokenizer.json").symlink_to("../../blobs/t")
    (snapshot / "notes.txt").write_text("inside")
    (snapshot / "inner.txt").symlink_to("notes.txt")  # inside the folder itself
    mv = reg.push(snapshot, "m")
    assert sorted(a["name"] for a in mv.metadata["attachments"]) == [
        "inner.txt", "notes.txt", "tokenizer.json"]
