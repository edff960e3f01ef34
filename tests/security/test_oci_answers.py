"""Hostile OCI registries: every answer below is a typed error, nothing is written outside the
registry home (the suite's sentinel), nothing but verified bytes stays in the cache, and no
half version reaches the catalog."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections.abc import Iterator

import pytest
import torch
from safetensors.torch import save

import registry
from registry.oci import modelpack

from .oci_fake import FakeOci, sha


@pytest.fixture
def fake() -> Iterator[FakeOci]:
    server = FakeOci().start()
    yield server
    server.close()


def _weights() -> bytes:
    return save({"module.fc.weight": torch.arange(12.0).reshape(3, 4),
                 "module.fc.bias": torch.zeros(3)})


def _layer(data: bytes, path: str = "model.safetensors", *, digest: str | None = None,
           size: int | None = None, media_type: str = modelpack.WEIGHT) -> dict:
    return {"mediaType": media_type, "digest": digest or sha(data),
            "size": len(data) if size is None else size,
            "annotations": {modelpack.FILEPATH: path}}


def _nothing_kept(reg: registry.Registry) -> None:
    assert reg.list_models() == []
    cache = reg.settings.cache_dir
    kept = [p for p in (cache / "blobs").rglob("*") if p.is_file()] if cache.exists() else []
    for blob in kept:  # only verified bytes remain, each under its own digest
        assert sha(blob.read_bytes()) == f"sha256:{blob.name}"
    tmp = cache / "tmp"
    assert not tmp.exists() or not any(tmp.iterdir())


def test_a_foreign_artifact_imports_when_honest(fake: FakeOci, reg: registry.Registry) -> None:
    """The control case: the same fake serving honest answers imports fine."""
    data = _weights()
    fake.blobs[sha(data)] = data
    fake.add_artifact("m", "v1", [_layer(data)])
    mv = reg.import_oci(fake.ref("m:v1"), "m")
    assert sorted(mv.metadata["tensors"]) == ["fc.bias", "fc.weight"]


def test_a_layer_sent_without_a_length_pulls(fake: FakeOci, reg: registry.Registry) -> None:
    """A body whose end is the connection's close (no Content-Length) is read to its end."""
    data = _weights()
    fake.blobs[sha(data)] = data
    fake.blob_length = False
    fake.add_artifact("m", "v1", [_layer(data)])
    module = reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    assert torch.equal(module.fc.weight, torch.arange(12.0).reshape(3, 4))


def test_a_layer_whose_bytes_are_not_its_digest(fake: FakeOci, reg: registry.Registry) -> None:
    data = _weights()
    forged = bytearray(data)
    forged[-1] ^= 0xFF
    fake.blobs[sha(data)] = bytes(forged)
    fake.add_artifact("m", "v1", [_layer(data)])
    with pytest.raises(registry.DigestMismatchError, match=sha(data)):
        reg.import_oci(fake.ref("m:v1"), "m")
    _nothing_kept(reg)
    assert not (reg.settings.cache_dir / "blobs" / "sha256" / sha(data)[7:]).exists()


def test_a_layer_of_100_gb_is_refused_before_a_byte_is_fetched(
        fake: FakeOci, reg: registry.Registry) -> None:
    reg.settings.cache_dir.mkdir(parents=True)
    huge = max(100 * 10**9, shutil.disk_usage(reg.settings.cache_dir).free + 1)
    fake.add_artifact("m", "v1", [_layer(b"x", size=huge)])
    with pytest.raises(registry.OciArtifactError, match="declares"):
        reg.import_oci(fake.ref("m:v1"), "m")
    assert fake.asked("GET", "/blobs/") == []
    _nothing_kept(reg)


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_more_bytes_than_declared_are_refused(fake: FakeOci, reg: registry.Registry,
                                              length: bool) -> None:
    """Refused by the Content-Length before a byte is read, or when the first byte past the
    declared size arrives (a body that only ends when the connection closes)."""
    data = _weights()
    fake.blobs[sha(data)] = data + b"\0" * 4096
    fake.blob_length = length
    fake.add_artifact("m", "v1", [_layer(data)])
    with pytest.raises(registry.OciUnavailableError, match="more than the"):
        reg.import_oci(fake.ref("m:v1"), "m")
    _nothing_kept(reg)


@pytest.mark.parametrize("kind", ["index", "docker-list", "image"])
def test_an_index_or_an_image_is_not_a_model(fake: FakeOci, reg: registry.Registry,
                                             kind: str) -> None:
    if kind == "image":
        config = b'{"architecture":"amd64","os":"linux"}'
        fake.blobs[sha(config)] = config
        body = json.dumps({"schemaVersion": 2, "mediaType": modelpack.OCI_MANIFEST,
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": sha(config), "size": len(config)},
                           "layers": [_layer(b"layer", media_type="application/vnd.oci.image."
                                                                  "layer.v1.tar+gzip")]})
        media_type, what = modelpack.OCI_MANIFEST, "not a model artifact"
    else:
        media_type = modelpack.OCI_INDEX if kind == "index" else modelpack.DOCKER_LIST
        body = json.dumps({"schemaVersion": 2, "mediaType": media_type,
                           "manifests": [{"mediaType": modelpack.OCI_MANIFEST,
                                          "digest": sha(b"m"), "size": 1}]})
        what = "image index"
    fake.manifests["/v2/m/manifests/v1"] = (body.encode(), media_type)
    with pytest.raises(registry.OciArtifactError, match=what):
        reg.import_oci(fake.ref("m:v1"), "m")
    with pytest.raises(registry.OciArtifactError, match=what):
        reg.pull(fake.ref("m:v1"), device="cpu")
    assert fake.asked("GET", "/blobs/sha256") == []
    _nothing_kept(reg)


@pytest.mark.parametrize("path", ["../../evil", "../victim.safetensors", "/abs/model.safetensors",
                                  "a/../../outside/secret.txt", ".hidden", ""])
def test_a_file_path_annotation_that_climbs_out(fake: FakeOci, reg: registry.Registry,
                                                path: str) -> None:
    data = _weights()
    fake.blobs[sha(data)] = data
    fake.add_artifact("m", "v1", [_layer(data, "model.safetensors"),
                                  _layer(b"{}", path, media_type=modelpack.WEIGHT_CONFIG)])
    fake.blobs[sha(b"{}")] = b"{}"
    with pytest.raises(registry.OciArtifactError, match=modelpack.FILEPATH):
        reg.import_oci(fake.ref("m:v1"), "m")
    assert fake.asked("GET", "/blobs/sha256") == []
    _nothing_kept(reg)


def test_a_redirect_to_a_host_that_is_not_loopback(fake: FakeOci,
                                                   reg: registry.Registry) -> None:
    data = _weights()
    fake.add_artifact("m", "v1", [_layer(data)])
    fake.overrides[("GET", "/v2/m/blobs/")] = lambda: (
        307, {"Location": f"http://203.0.113.7/blobs/{sha(data)}"}, b"")
    with pytest.raises(registry.InsecureTransportError, match="203.0.113.7"):
        reg.import_oci(fake.ref("m:v1"), "m")
    _nothing_kept(reg)


def test_plain_http_to_a_remote_host_is_refused_unless_asked() -> None:
    from registry.oci.refs import check_url, parse_oci_ref

    with pytest.raises(registry.InsecureTransportError):
        check_url("http://registry.example/v2/", parse_oci_ref("oci://registry.example/m:v1"),
                  what="URL")
    asked = parse_oci_ref("oci://registry.example/m:v1", plain_http=True)
    assert asked.base_url == "http://registry.example"
    assert parse_oci_ref("oci://registry.example/m:v1").base_url == "https://registry.example"
    assert parse_oci_ref("oci://127.0.0.1:5000/m:v1").base_url == "http://127.0.0.1:5000"


def test_a_500_halfway_through_a_pull(fake: FakeOci, reg: registry.Registry) -> None:
    first, second = _weights(), b'{"vocab": 1}'
    fake.blobs[sha(first)] = first
    fake.add_artifact("m", "v1", [_layer(first),
                                  _layer(second, "tokenizer.json",
                                         media_type=modelpack.WEIGHT_CONFIG)])
    fake.overrides[("GET", f"/v2/m/blobs/{sha(second)}")] = lambda: (
        500, {}, b'{"errors":[{"code":"UNKNOWN","message":"storage failed"}]}')
    with pytest.raises(registry.OciUnavailableError, match="500"):
        reg.import_oci(fake.ref("m:v1"), "m")
    _nothing_kept(reg)


def test_a_500_halfway_through_a_push_tags_nothing(fake: FakeOci, reg: registry.Registry) -> None:
    reg.push({"w": torch.randn(64, 64), "b": torch.randn(8)}, "m", shard_size=4096)
    answers = iter([None])  # the first upload is completed, every later one answers 500
    fake.overrides[("PUT", "/v2/m/blobs/uploads/")] = lambda: next(answers, (500, {}, b""))
    with pytest.raises(registry.OciUnavailableError, match="500"):
        reg.push_oci("m:v1", fake.ref("m:v1"))
    assert fake.asked("PUT", "/manifests/") == []


def test_an_upload_that_breaks_resumes_from_the_registry_offset(
        fake: FakeOci, reg: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.oci import transport

    monkeypatch.setattr(transport, "CHUNK_BYTES", 4096)
    mv = reg.push({"w": torch.randn(64, 64)}, "m")
    failures = iter([None, (503, {}, b"")])  # the second PATCH fails once
    fake.overrides[("PATCH", "/v2/m/blobs/uploads/")] = lambda: next(failures, None)
    done = reg.push_oci("m:v1", fake.ref("m:v1"))
    assert done.uploaded == done.layers
    shard = mv.metadata["files"][0]
    assert fake.blobs[shard["digest"]] == reg.backend.blob_path(
        shard["digest"], shard["size"]).read_bytes()
    assert len(fake.asked("GET", "/blobs/uploads/")) == 1  # asked where to resume


def test_the_bearer_token_dance(fake: FakeOci, reg: registry.Registry,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    data = _weights()
    fake.blobs[sha(data)] = data
    fake.add_artifact("m", "v1", [_layer(data)])
    fake.token = "issued-token"
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps(
        {fake.host: {"username": "bob", "password": "pw"}}))
    mv = registry.Registry().import_oci(fake.ref("m:v1"), "m")
    assert mv.ref == "m:v1"
    asks = [(p, h) for m, p, h in fake.requests if p.startswith("/token")]
    assert asks and "scope=repository%3Am%3Apull" in asks[0][0] and "service=fake" in asks[0][0]
    assert asks[0][1]["Authorization"].startswith("Basic ")
    # once the token is known, requests carry it and are not challenged again
    assert len(asks) == 1


def test_a_bad_auth_variable_names_itself_not_its_secret(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps({"ghcr.io": {"username": "me"}}))
    with pytest.raises(registry.SettingsError, match="REGISTRY_OCI_AUTH") as caught:
        registry.Settings.from_env()
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps(
        {"ghcr.io": {"auth": "not base64 hunter2"}}))
    with pytest.raises(registry.SettingsError, match="REGISTRY_OCI_AUTH") as caught:
        registry.Settings.from_env()
    assert "hunter2" not in str(caught.value)
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps(
        {"ghcr.io": {"username": "me", "password": "hunter2"}}))
    assert "hunter2" not in repr(registry.Settings.from_env())


@pytest.mark.parametrize("text", ["oci://", "oci://host", "oci://Host:99999/m", "oci://h/UP:v1",
                                  "oci://h/m:.bad", "oci://h/m@sha256:abc", "s3://b/m:v1",
                                  "oci://h/../m:v1"])
def test_bad_oci_refs(text: str) -> None:
    from registry.oci.refs import parse_oci_ref

    with pytest.raises(registry.RefError):
        parse_oci_ref(text)



# -- the spec's tar layers (another producer's archives) -------------------------------------

def _tar(members: list[tuple[tarfile.TarInfo, bytes]], *, gzip: bool = False) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gzip else "w") as tar:
        for info, body in members:
            info.size = len(body) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(body) if info.isreg() else None)
    return out.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("gzip", [False, True])
def test_tar_layers_import_and_pull_like_raw_ones(fake: FakeOci, reg: registry.Registry,
                                                  gzip: bool) -> None:
    archive = _tar([(_member("./", tarfile.DIRTYPE), b""),
                    (_member("./model.safetensors"), _weights())], gzip=gzip)
    config = _tar([(_member("notes/README.md"), b"# m\n")], gzip=gzip)
    suffix = ".tar+gzip" if gzip else ".tar"
    fake.blobs.update({sha(archive): archive, sha(config): config})
    fake.add_artifact("m", "v1", [
        _layer(archive, "model.safetensors",
               media_type=modelpack.WEIGHT.replace(".raw", suffix)),
        _layer(config, "notes", media_type=modelpack.DOC.replace(".raw", suffix))])
    module = reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    assert torch.equal(module.fc.weight, torch.arange(12.0).reshape(3, 4))
    mv = reg.import_oci(fake.ref("m:v1"), "m")
    assert sorted(mv.metadata["tensors"]) == ["fc.bias", "fc.weight"]
    assert reg.settings.cache_dir.joinpath("oci", "checkouts").exists()
    assert list(reg.settings.cache_dir.joinpath("oci", "checkouts").iterdir()) == []


class _Fc(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)


@pytest.mark.parametrize("member", [
    _member("../escape.safetensors"), _member("/etc/cron.d/evil"),
    _member("a/../../outside.txt"), _member(".hidden/x"),
    _member("model.safetensors", tarfile.SYMTYPE, "/etc/passwd"),
    _member("model.safetensors", tarfile.LNKTYPE, "../../victim"),
    _member("fifo", tarfile.FIFOTYPE), _member("dev", tarfile.CHRTYPE),
], ids=["dotdot", "absolute", "climb", "hidden", "symlink", "hardlink", "fifo", "device"])
def test_a_tar_member_that_is_not_a_plain_file_inside(fake: FakeOci, reg: registry.Registry,
                                                      member: tarfile.TarInfo) -> None:
    archive = _tar([(_member("model.safetensors"), _weights()), (member, b"owned\n")])
    fake.blobs[sha(archive)] = archive
    fake.add_artifact("m", "v1", [_layer(archive, "model",
                                         media_type=modelpack.WEIGHT.replace(".raw", ".tar"))])
    with pytest.raises(registry.OciArtifactError, match="holds"):
        reg.import_oci(fake.ref("m:v1"), "m")
    with pytest.raises(registry.OciArtifactError, match="holds"):
        reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    _nothing_kept(reg)
    assert list(reg.settings.cache_dir.joinpath("oci", "checkouts").iterdir()) == []


def test_two_layers_writing_one_file_and_zstd_are_refused(fake: FakeOci,
                                                          reg: registry.Registry) -> None:
    data = _weights()
    archive = _tar([(_member("model.safetensors"), data)])
    fake.blobs.update({sha(data): data, sha(archive): archive})
    fake.add_artifact("m", "v1", [
        _layer(data), _layer(archive, "more", media_type=modelpack.WEIGHT + "x")])
    fake.add_artifact("m", "v2", [
        _layer(data), _layer(archive, "more",
                             media_type=modelpack.WEIGHT.replace(".raw", ".tar"))])
    fake.add_artifact("m", "v3", [
        _layer(archive, "more", media_type=modelpack.WEIGHT.replace(".raw", ".tar+zstd"))])
    with pytest.raises(registry.OciArtifactError, match="media type"):
        reg.import_oci(fake.ref("m:v1"), "m")
    with pytest.raises(registry.OciArtifactError, match="two members or layers write"):
        reg.import_oci(fake.ref("m:v2"), "m")
    with pytest.raises(registry.OciArtifactError, match="zstd"):
        reg.pull(fake.ref("m:v3"), device="cpu", model=_Fc)
    _nothing_kept(reg)


def test_a_tar_that_unpacks_past_the_free_space_stops(fake: FakeOci, reg: registry.Registry,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.oci import door

    archive = _tar([(_member("model.safetensors"), _weights()),
                    (_member("big.bin"), b"\0" * 65536)], gzip=True)
    fake.blobs[sha(archive)] = archive
    fake.add_artifact("m", "v1", [_layer(archive, "model",
                                         media_type=modelpack.WEIGHT.replace(".raw",
                                                                             ".tar+gzip"))])
    monkeypatch.setattr(door, "free_bytes", lambda _root: 4096)
    with pytest.raises(registry.OciArtifactError, match="left free in the cache"):
        reg.import_oci(fake.ref("m:v1"), "m")
    _nothing_kept(reg)


def test_a_foreign_pull_checks_each_layer_and_adds_no_version(fake: FakeOci,
                                                              reg: registry.Registry) -> None:
    data = _weights()
    forged = bytearray(data)
    forged[-1] ^= 0xFF
    fake.blobs[sha(data)] = bytes(forged)
    fake.add_artifact("m", "v1", [_layer(data)])
    with pytest.raises(registry.DigestMismatchError, match=sha(data)):
        reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    _nothing_kept(reg)
    fake.blobs[sha(data)] = data
    module = reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)
    assert torch.equal(module.fc.bias, torch.zeros(3))
    assert reg.list_models() == []
    fetched = len(fake.asked("GET", "/blobs/"))
    again = reg.pull(fake.ref("m:v1"), device="cpu", model=_Fc)  # normalized once, then cached
    assert torch.equal(again.fc.weight, module.fc.weight)
    assert len(fake.asked("GET", "/blobs/")) == fetched
