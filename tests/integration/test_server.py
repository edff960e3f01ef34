"""The registry server over a file store: a real `registry serve` subprocess on loopback."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

import registry
from registry.errors import DigestMismatchError, NotFoundError, RefError, VersionExistsError
from tests.helpers import assert_same_state, clean_env, run_cli, trained_mlp
from tests.integration.serving import Service, registry_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("server")
    with registry_server(root / "home", root) as service:
        service.home = root / "home"  # type: ignore[attr-defined]
        yield service


@pytest.fixture
def remote(server: Service) -> Iterator[registry.Registry]:
    reg = registry.Registry(server.url)
    yield reg
    reg.close()


def _name(request: pytest.FixtureRequest) -> str:
    return request.node.name.lower().replace("_", "-")[:60]


def test_health_and_openapi(server: Service) -> None:
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}
    spec = httpx.get(server.url + "/openapi.json").json()
    paths = set(spec["paths"])
    for path in ("/api/v1/models", "/api/v1/models/{name}/versions", "/api/v1/resolve",
                 "/api/v1/models/{name}/pushes", "/api/v1/models/{name}/pushes/{version}/commit",
                 "/api/v1/blobs/{digest}", "/api/v1/gc"):
        assert path in paths, path


def test_push_pull_round_trip_through_server(remote: registry.Registry, tmp_path: Path,
                                             server: Service,
                                             request: pytest.FixtureRequest) -> None:
    name = _name(request)
    model = trained_mlp()
    mv = remote.push(model, name, tags={"dataset": "toy"}, aliases=["staging"])
    assert (mv.name, mv.version, mv.tags, mv.aliases) == (name, 1, {"dataset": "toy"}, ["staging"])
    # A client with an empty cache downloads through the server and verifies the bytes.
    fresh = registry.Registry(server.url, home=tmp_path / "other-client")
    try:
        state = fresh.pull_state_dict(f"{name}@staging", device="cpu")
        assert_same_state({k: v for k, v in state.items() if isinstance(v, torch.Tensor)},
                          model.state_dict())
        cached = list((tmp_path / "other-client" / "cache" / "blobs").rglob("*"))
        assert any(p.is_file() for p in cached)
        assert fresh.show(name).digest == mv.digest
        assert [v.ref for v in fresh.list_versions(name)] == [f"{name}:v1"]
        assert name in fresh.list_models()
    finally:
        fresh.close()
    # The server's own store holds the blob at its content address.
    blob = server.home / "objects" / "blobs" / "sha256" / mv.digest[7:]  # type: ignore[attr-defined]
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == mv.digest[7:]


def test_same_errors_and_messages_as_embedded(remote: registry.Registry, server: Service,
                                               request: pytest.FixtureRequest) -> None:
    name = _name(request)
    remote.push(trained_mlp(), name)
    with pytest.raises(NotFoundError) as over_http:
        remote.show(f"{name}:v9")
    embedded = registry.Registry(home=server.home)  # type: ignore[attr-defined]
    try:
        with pytest.raises(NotFoundError) as in_process:
            embedded.show(f"{name}:v9")
    finally:
        embedded.close()
    assert str(over_http.value) == str(in_process.value) == f"{name}:v9 not found; latest is v1"
    with pytest.raises(VersionExistsError, match="already exists"):
        remote.push(trained_mlp(), f"{name}:v1")
    with pytest.raises(RefError, match="invalid alias"):
        remote.set_alias(name, "Bad Alias", 1)


def test_aliases_tags_delete_and_gc(remote: registry.Registry,
                                    request: pytest.FixtureRequest) -> None:
    name = _name(request)
    first = remote.push(trained_mlp(0), name)
    second = remote.push(trained_mlp(1), name)
    assert remote.set_alias(name, "production", 1).aliases == ["production"]
    assert remote.show(f"{name}@production").ref == first.ref
    assert remote.set_tags(f"{name}:v2", {"owner": "vision"}).tags == {"owner": "vision"}
    assert remote.set_tags(f"{name}:v2", {"owner": None}).tags == {}
    remote.delete_alias(name, "production")
    with pytest.raises(NotFoundError, match="has no aliases"):
        remote.show(f"{name}@production")
    assert remote.delete_version(f"{name}:v2").ref == second.ref
    with pytest.raises(NotFoundError, match="was deleted"):
        remote.show(f"{name}:v2")
    report = remote.gc()
    assert second.digest in report.deleted
    assert first.digest not in report.deleted
    assert remote.pull_state_dict(f"{name}:v1", device="cpu")  # still loads after gc


def test_two_phase_push_is_invisible_until_commit(server: Service,
                                                  request: pytest.FixtureRequest) -> None:
    name = _name(request)
    api = server.url + "/api/v1"
    data = b"not really safetensors, but bytes with a digest"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    begun = httpx.post(f"{api}/models/{name}/pushes", json=_one_file(digest, len(data))).json()
    assert begun["version"] == 1
    (upload,) = begun["uploads"]
    assert upload["url"] == f"/api/v1/blobs/{digest}" and upload["digest"] == digest
    assert httpx.get(f"{api}/models").json()["models"].count(name) == 0
    assert httpx.get(f"{api}/resolve", params={"ref": name}).status_code == 404
    # A commit before the upload is refused and still nothing is visible.
    early = httpx.post(f"{api}/models/{name}/pushes/1/commit", json={"manifest": {}})
    assert early.status_code in (400, 404)
    assert httpx.put(server.url + upload["url"], content=data).status_code == 201
    assert httpx.get(f"{api}/resolve", params={"ref": name}).status_code == 404
    aborted = httpx.delete(f"{api}/models/{name}/pushes/1")
    assert aborted.status_code == 204
    assert httpx.post(f"{api}/models/{name}/pushes/1/commit",
                      json={"manifest": {}}).json()["error"]["code"] == "not_found"
    # The aborted number is retired: the next push gets v2.
    assert httpx.post(f"{api}/models/{name}/pushes",
                      json=_one_file(digest, len(data))).json()["version"] == 2


def test_upload_with_wrong_bytes_is_refused(server: Service,
                                            request: pytest.FixtureRequest) -> None:
    digest = "sha256:" + hashlib.sha256(b"the real bytes").hexdigest()
    begun = httpx.post(f"{server.url}/api/v1/models/{_name(request)}/pushes",
                       json=_one_file(digest, len(b"the real bytes")))
    assert begun.status_code == 200, begun.text
    response = httpx.put(f"{server.url}/api/v1/blobs/{digest}", content=b"other bytes")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == DigestMismatchError.code
    assert digest in error["message"]
    assert httpx.get(f"{server.url}/api/v1/blobs/{digest}").status_code == 404


def test_blob_download_supports_range(remote: registry.Registry, server: Service,
                                      request: pytest.FixtureRequest) -> None:
    mv = remote.push(trained_mlp(), _name(request))
    url = f"{server.url}/api/v1/blobs/{mv.digest}"
    whole = httpx.get(url)
    assert whole.status_code == 200
    assert hashlib.sha256(whole.content).hexdigest() == mv.digest[7:]
    part = httpx.get(url, headers={"Range": "bytes=8-27"})
    assert part.status_code == 206
    assert part.content == whole.content[8:28]
    assert part.headers["content-range"] == f"bytes 8-27/{len(whole.content)}"
    link = httpx.get(f"{url}/link").json()
    assert link == {"url": f"/api/v1/blobs/{mv.digest}", "direct": False,
                    "size": len(whole.content)}


def test_traversal_in_a_path_matches_no_route(server: Service) -> None:
    response = httpx.get(server.url + "/api/v1/models/..%2F..%2Fetc/versions")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("path", [
    "/api/v1/models/UPPER/versions",
    "/api/v1/models/..x/versions",
    "/api/v1/models/a%00b/versions/1",
    "/api/v1/models/ok/versions/v0",
    "/api/v1/blobs/sha256:..%5C..%5Cregistry.db",
    "/api/v1/blobs/sha256:abc",
    "/api/v1/blobs/md5:abc/link",
    "/api/v1/resolve?ref=..%2Fx",
])
def test_bad_names_and_digests_are_refused_before_any_lookup(server: Service, path: str) -> None:
    response = httpx.get(server.url + path)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_ref"


def test_cli_through_registry_uri(server: Service, tmp_path: Path,
                                  request: pytest.FixtureRequest) -> None:
    name = _name(request)[:40]
    checkpoint = tmp_path / "model.pt"
    torch.save(trained_mlp().state_dict(), checkpoint)
    env = clean_env(tmp_path / "cli-home", REGISTRY_URI=server.url)
    pushed = run_cli("push", name, str(checkpoint), "--tag", "via=cli", env=env, check=True)
    assert f"pushed {name}:v1" in pushed.stdout
    listed = json.loads(run_cli("ls", name, "--json", env=env, check=True).stdout)
    assert [(v["ref"], v["tags"]) for v in listed] == [(f"{name}:v1", {"via": "cli"})]
    out = tmp_path / "pulled.safetensors"
    run_cli("pull", f"{name}:v1", "-o", str(out), env=env, check=True)
    from safetensors.torch import load_file

    assert_same_state(load_file(out), trained_mlp().state_dict())
    missing = run_cli("show", f"{name}:v7", env=env)
    assert missing.returncode == NotFoundError.exit_code
    assert missing.stderr.strip() == f"error: {name}:v7 not found; latest is v1"
    # Nothing was written to the client's own embedded catalog.
    assert not (tmp_path / "cli-home" / "registry.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("manifest", [{}, {"format_version": "1"}, {"format_version": 1},
                                      {"format_version": 99}, {"format_version": 1, "name": 3}])
def test_commit_refuses_manifests_that_do_not_match_the_reservation(
        server: Service, manifest: dict[str, object], request: pytest.FixtureRequest) -> None:
    name = _name(request)[:50].strip("-.")
    api = server.url + "/api/v1"
    data = name.encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    version = httpx.post(f"{api}/models/{name}/pushes",
                         json=_one_file(digest, len(data))).json()["version"]
    httpx.put(f"{api}/blobs/{digest}", content=data)
    response = httpx.post(f"{api}/models/{name}/pushes/{version}/commit",
                          json={"manifest": manifest})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_manifest"
    assert httpx.get(f"{api}/resolve", params={"ref": name}).status_code == 404


def _one_file(digest: str, size: int) -> dict[str, object]:
    return {"files": [{"role": "weights", "name": "model.safetensors", "digest": digest,
                       "size": size}]}


def test_multi_shard_push_uploads_only_the_shard_the_server_lacks(
        server: Service, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from tests.helpers import block_lm

    name = _name(request)[:50].strip("-.")
    first = registry.Registry(server.url)
    v1 = first.push(block_lm(), name, shard_size="16KiB")
    assert (v1.metadata["push"]["shards"], v1.metadata["push"]["shards_uploaded"]) == (5, 5)
    tuned = block_lm()
    with torch.no_grad():
        tuned.layers[-1].mlp.weight.add_(1)
    # Another client (another cache) pushes the fine-tune: four shards are already there.
    other = registry.Registry(server.url, home=tmp_path / "other")
    before = server.output().count("PUT /api/v1/blobs/")
    v2 = other.push(tuned, name, shard_size="16KiB")
    assert (v2.metadata["push"]["shards"], v2.metadata["push"]["shards_uploaded"]) == (5, 1)
    assert server.output().count("PUT /api/v1/blobs/") - before == 1
    puller = registry.Registry(server.url, home=tmp_path / "puller")
    assert_same_state(puller.pull_state_dict(f"{name}:v2", device="cpu"), tuned.state_dict())
    assert len(list((tmp_path / "puller" / "cache" / "blobs" / "sha256").iterdir())) == 5
    for reg in (first, other, puller):
        reg.close()


def test_uploads_only_for_a_push_in_progress_and_no_larger(server: Service,
                                                           request: pytest.FixtureRequest) -> None:
    api = server.url + "/api/v1"
    data = b"bytes that some push declared"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    # No push lists this digest: 409, and nothing is stored.
    stray = httpx.put(f"{api}/blobs/{digest}", content=data)
    assert stray.status_code == 409, stray.text
    assert stray.json()["error"]["code"] == "unexpected_upload"
    assert digest in stray.json()["error"]["message"]
    assert "begin the push first" in stray.json()["error"]["message"]
    assert httpx.head(f"{api}/blobs/{digest}").status_code == 404
    # A push declares 8 bytes; more than that is refused before it is read, nothing stored.
    short = data[:8]
    short_digest = "sha256:" + hashlib.sha256(short).hexdigest()
    name = _name(request)
    assert httpx.post(f"{api}/models/{name}/pushes",
                      json=_one_file(short_digest, len(short))).status_code == 200
    oversized = httpx.put(f"{api}/blobs/{short_digest}", content=data)
    assert oversized.status_code == 409, oversized.text
    assert "reserved 8" in oversized.json()["error"]["message"]
    assert httpx.head(f"{api}/blobs/{short_digest}").status_code == 404
    # The declared bytes go in.
    assert httpx.put(f"{api}/blobs/{short_digest}", content=short).status_code == 201


def test_module_metadata_and_key_order_survive_the_server(remote: registry.Registry,
                                                          server: Service, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    from collections import OrderedDict

    from tests.integration.test_embedded import VersionSeeingNet

    name = _name(request)[:50].strip("-.")
    model = VersionSeeingNet()
    model.train()
    model(torch.randn(8, 4))
    model.eval()
    expected = model.state_dict()
    assert list(expected) != sorted(expected)  # "fc.*" before "bn.*" only if order is kept
    remote.push(model, name, factory=VersionSeeingNet)
    # Another client, another cache: everything below came through the server's wire format.
    fresh = registry.Registry(server.url, home=tmp_path / "fresh")
    try:
        state = fresh.pull_state_dict(name, device="cpu")
        assert isinstance(state, OrderedDict)
        assert list(state) == list(expected)
        assert dict(state._metadata) == dict(expected._metadata)  # type: ignore[attr-defined]
        VersionSeeingNet.seen.clear()
        pulled = fresh.pull(name, device="cpu")
        assert VersionSeeingNet.seen == [2], "BatchNorm must see version 2 through the server"
        x = torch.randn(3, 4)
        assert torch.equal(pulled(x), model(x))
    finally:
        fresh.close()


def test_a_download_cut_half_way_resumes_with_a_range_and_is_verified(
        server: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    """The client hashes a blob as it arrives; a stream cut half way resumes where it broke
    (a Range request), and the digest of the two parts together is what the cache checks."""
    from tests.integration.conftest import CuttingProxy

    weights = {"w": torch.randn(2**20)}  # 4 MiB: the cut falls inside the first 8 MiB block
    name = _name(request)
    direct = registry.Registry(server.url)
    mv = direct.push(weights, name)
    direct.close()
    proxy = CuttingProxy(server.url, keep=1_500_000)
    monkeypatch.setenv("REGISTRY_HOME", str(tmp_path / "client"))  # an empty cache
    reg = registry.Registry(proxy.url)
    try:
        proxy.cut_next = 2  # the link's GET and the blob's share one connection
        pulled = reg.pull_state_dict(mv.ref, device="cpu")
        assert torch.equal(pulled["w"], weights["w"])
        gets = [r for r in proxy.blob_requests(b"GET") if not r.split()[1].endswith(b"/link")]
        assert len(gets) == 2, f"one cut download and one resumed: {gets}"
        assert proxy.cuts >= 1
        assert len(proxy.ranges) == 1 and proxy.ranges[0].startswith(b"bytes=")
    finally:
        reg.close()
        proxy.close()


def test_a_resume_answered_with_the_whole_blob_starts_the_file_and_hash_again(
        server: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    """A server or proxy may ignore a Range request and answer 200 with the whole blob: the
    client must then start the file and its hash from the first byte, not append."""
    from tests.integration.conftest import CuttingProxy

    weights = {"w": torch.randn(2**20)}
    name = _name(request)
    direct = registry.Registry(server.url)
    mv = direct.push(weights, name)
    direct.close()
    proxy = CuttingProxy(server.url, keep=1_500_000)
    proxy.drop_range = True
    monkeypatch.setenv("REGISTRY_HOME", str(tmp_path / "client"))
    reg = registry.Registry(proxy.url)
    try:
        proxy.cut_next = 2
        pulled = reg.pull_state_dict(mv.ref, device="cpu")
        assert torch.equal(pulled["w"], weights["w"])
        assert len(proxy.ranges) == 1, "the client asked to resume, and the range was dropped"
        cached = list((tmp_path / "client" / "cache").rglob(mv.metadata["files"][0]["digest"][7:]))
        assert [p.stat().st_size for p in cached] == [mv.metadata["files"][0]["size"]]
    finally:
        reg.close()
        proxy.close()
