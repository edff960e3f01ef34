"""Per-model token scopes on a real `registry serve`: a token limited to ``team-a-*`` cannot tell
a model it may not see from one that does not exist, on every route that names a model (the
matrix is built from the server's own routes, so a new route is covered or this fails), nor
reach another model's blobs by digest, nor learn from a push which blobs others hold."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

import registry
from registry.files import version_files
from registry.io.digests import version_digest
from server.app import ROUTERS
from server.auth import AuthFile, parse_model_patterns, parse_scopes
from tests.helpers import assert_same_state, trained_mlp
from tests.integration.serving import Service, registry_server

API = "/api/v1"
HIDDEN, MISSING, OWN, OWN_MISSING = "team-b-y", "team-b-zzz", "team-a-x", "team-a-zzz"
TOKENS = {  # name: (scopes, model patterns)
    "boss": ("admin", None),
    "team-a": ("read,write", "team-a-*,shared"),
    "team-a-admin": ("admin", "team-a-*"),
    "team-a-reader": ("read", "team-a-*"),
}
# A value for each path parameter other than the model's (an existing version, alias, digest; the
# Hub door's revision and file).
FILLERS = {"version": "1", "alias": "prod", "digest": "sha256:" + "ab" * 32, "revision": "main",
           "path": "config.json"}
MODEL_PARAMS = ("name", "repo")  # the REST API's {name}, the Hub door's {repo}


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, dict[str, str]]]:
    root = tmp_path_factory.mktemp("scopes")
    auth_file = root / "auth.json"
    tokens = {name: AuthFile(auth_file).create(
        name, parse_scopes(scopes), None if models is None else parse_model_patterns(models))
        for name, (scopes, models) in TOKENS.items()}
    with registry_server(root / "home", root,
                         env_extra={"REGISTRY_AUTH_FILE": str(auth_file)}) as service:
        boss = registry.Registry(service.url, token=tokens["boss"], home=root / "client")
        boss.push(trained_mlp(), OWN)
        boss.push(trained_mlp(1), HIDDEN, aliases=["prod"], tags={"team": "b"})
        boss.push(trained_mlp(2), HIDDEN)
        boss.close()
        yield service, tokens


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _model_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the server whose path names a model."""
    found = []
    for router in ROUTERS:
        for route in router.routes:
            if isinstance(route, APIRoute) and any(f"{{{p}}}" in route.path
                                                   for p in MODEL_PARAMS):
                found.extend((method, route.path) for method in sorted(route.methods))
    return found


def _scope_of(method: str, path: str) -> str:
    """The scope the route's own dependency asks for (server/dependencies.py: read, write or
    admin), read off the route, so a new admin route is expected to answer 403 to a write token."""
    from server import dependencies

    needs = {id(dependencies.read.dependency): "read", id(dependencies.write.dependency): "write",
             id(dependencies.admin.dependency): "admin"}
    for router in ROUTERS:
        for route in router.routes:
            if isinstance(route, APIRoute) and route.path == path and method in route.methods:
                found = [needs[id(d.call)] for d in route.dependant.dependencies
                         if id(d.call) in needs]
                return found[0] if found else "read"
    raise AssertionError(f"no route {method} {path}")


def _fill(path: str, name: str) -> str:
    return re.sub(r"\{(\w+)(?::path)?\}",
                  lambda m: name if m[1] in MODEL_PARAMS else FILLERS[m[1]], path)


def _answer(response: httpx.Response, name: str) -> tuple[int, Any]:
    """Status, body and the Hub's error headers with the model name taken out: what must not
    differ."""
    body = response.json() if response.content else None
    hub = {k: v for k, v in response.headers.items() if k.lower().startswith("x-error")}
    text = str((body, hub)).replace(name, "NAME")
    return response.status_code, text


def test_the_matrix_covers_the_routes_that_name_a_model() -> None:
    routes = _model_routes()
    paths = {path for _, path in routes}
    # The routes of this server that take a model (a new one joins the matrix by itself).
    for expected in (f"{API}/models/{{name}}/versions", f"{API}/models/{{name}}/pushes",
                     "/hf/api/models/{repo}", "/hf/{repo}/resolve/{revision}/{path:path}",
                     f"{API}/models/{{name}}/aliases/{{alias}}",
                     f"{API}/models/{{name}}/versions/{{version}}/signatures",
                     f"{API}/models/{{name}}/versions/{{version}}/exports"):
        assert expected in paths
    assert len(routes) >= 12


@pytest.mark.parametrize(("method", "path"), _model_routes())
def test_a_hidden_model_answers_exactly_as_a_missing_one(
        scoped: tuple[Service, dict[str, str]], method: str, path: str) -> None:
    service, tokens = scoped
    for token in ("team-a", "team-a-admin", "team-a-reader"):
        answers = []
        for name in (HIDDEN, MISSING):
            response = httpx.request(method, service.url + _fill(path, name), json={},
                                     headers=_headers(tokens[token]))
            answers.append(_answer(response, name))
            assert HIDDEN not in response.text or name == HIDDEN
            assert "latest is" not in response.text and "prod" not in response.text
        assert answers[0] == answers[1], (token, method, path, answers)
        granted = {"team-a": {"read", "write"}, "team-a-admin": {"read", "write", "admin"},
                   "team-a-reader": {"read"}}[token]
        if _scope_of(method, path) not in granted:
            assert answers[0][0] == 403  # the scope is checked first, the same for both
        else:
            assert answers[0][0] == 404, answers
            assert "not_found" in answers[0][1] or "RepoNotFound" in answers[0][1]


@pytest.mark.parametrize("path", [
    "/models/{name}/versions", "/models/{name}/versions/1", "/models/{name}/versions/9",
    "/models/{name}/versions/1/signatures", "/models/{name}/versions/1/exports",
    "/resolve?ref={name}", "/resolve?ref={name}:v9", "/resolve?ref={name}@prod",
])
def test_hidden_missing_and_own_missing_models_read_alike(
        scoped: tuple[Service, dict[str, str]], path: str) -> None:
    service, tokens = scoped
    answers = []
    for name in (HIDDEN, MISSING, OWN_MISSING):
        response = httpx.get(service.url + API + path.replace("{name}", name),
                             headers=_headers(tokens["team-a"]))
        answers.append(_answer(response, name))
        # No name of a model the token may not see, in any message (the catalog's "models
        # include ..." hint among them).
        assert HIDDEN not in response.text or name == HIDDEN, response.text
        assert OWN not in response.text
    assert answers[0] == answers[1] == answers[2], answers
    assert answers[0][0] == 404
    # The same paths for a visible model answer (or say why not in its own terms).
    own = httpx.get(service.url + API + path.replace("{name}", OWN),
                    headers=_headers(tokens["team-a"]))
    assert own.status_code in (200, 404)
    if own.status_code == 404:
        assert "latest is v1" in own.text or "no alias" in own.text or "aliases" in own.text


def test_writes_to_a_hidden_model_change_nothing(scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api, a = service.url + API, _headers(tokens["team-a-admin"])
    for method, path, body in (
            ("PUT", f"/models/{HIDDEN}/aliases/prod", {"version": 2}),
            ("DELETE", f"/models/{HIDDEN}/aliases/prod", None),
            ("PATCH", f"/models/{HIDDEN}/versions/1/tags", {"tags": {"team": "a"}}),
            ("DELETE", f"/models/{HIDDEN}/versions/2?force=true", None),
            ("POST", f"/models/{HIDDEN}/pushes", {"files": [
                {"name": "model.safetensors", "digest": FILLERS["digest"], "size": 1}]})):
        response = httpx.request(method, api + path, json=body, headers=a)
        assert response.status_code == 404, (method, path, response.text)
    boss = httpx.get(f"{api}/models/{HIDDEN}/versions", headers=_headers(tokens["boss"])).json()
    assert [(v["version"], v["aliases"], v["tags"]) for v in boss["versions"]] == [
        (1, ["prod"], {"team": "b"}), (2, [], {})]


def test_lists_hold_only_visible_models(scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api = service.url + API
    seen = httpx.get(f"{api}/models", headers=_headers(tokens["team-a"])).json()
    assert seen == {"models": [OWN], "next": None}
    everything = httpx.get(f"{api}/models", headers=_headers(tokens["boss"])).json()
    assert everything["models"] == sorted([OWN, HIDDEN])
    # Paging walks past hidden names: one visible name per page, then the end.
    page = httpx.get(f"{api}/models", params={"limit": 1, "after": "a"},
                     headers=_headers(tokens["team-a"])).json()
    assert page == {"models": [OWN], "next": None}
    after = httpx.get(f"{api}/models", params={"limit": 1, "after": OWN},
                      headers=_headers(tokens["team-a"])).json()
    assert after == {"models": [], "next": None}


def _blob_of(service: Service, token: str, name: str) -> str:
    record = httpx.get(f"{service.url}{API}/resolve", params={"ref": name},
                       headers=_headers(token)).json()
    return str(record["manifest"]["files"][0]["digest"])


def test_blobs_of_hidden_models_answer_as_missing(scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api, a = service.url + API, _headers(tokens["team-a"])
    theirs = _blob_of(service, tokens["boss"], HIDDEN)
    mine = _blob_of(service, tokens["team-a"], OWN)
    absent = "sha256:" + hashlib.sha256(b"never stored").hexdigest()
    for suffix, method in (("/link", "GET"), ("", "GET"), ("", "HEAD")):
        hidden = httpx.request(method, f"{api}/blobs/{theirs}{suffix}", headers=a)
        missing = httpx.request(method, f"{api}/blobs/{absent}{suffix}", headers=a)
        assert hidden.status_code == missing.status_code == 404
        if method == "GET":
            assert hidden.text.replace(theirs, "D") == missing.text.replace(absent, "D")
        assert httpx.request(method, f"{api}/blobs/{mine}{suffix}", headers=a).status_code \
            == 200
        # A token over every model reads any blob.
        assert httpx.request(method, f"{api}/blobs/{theirs}{suffix}",
                             headers=_headers(tokens["boss"])).status_code == 200


def test_uploads_for_hidden_pushes_answer_as_unlisted(
        scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api = service.url + API
    data = b"bytes of a push of team b"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    begun = httpx.post(f"{api}/models/{HIDDEN}/pushes", headers=_headers(tokens["boss"]),
                       json={"files": [{"name": "model.safetensors", "digest": digest,
                                        "size": len(data)}]})
    assert begun.status_code == 200, begun.text
    unlisted = "sha256:" + hashlib.sha256(b"x").hexdigest()
    a = {**_headers(tokens["team-a"]), "Content-Type": "application/octet-stream"}
    hidden = httpx.put(f"{api}/blobs/{digest}", content=data, headers=a)
    missing = httpx.put(f"{api}/blobs/{unlisted}", content=b"x", headers=a)
    assert hidden.status_code == missing.status_code == 409
    assert hidden.text.replace(digest, "D") == missing.text.replace(unlisted, "D")
    httpx.delete(f"{api}/models/{HIDDEN}/pushes/{begun.json()['version']}",
                 headers=_headers(tokens["boss"]))


def _copy_of(record: dict[str, Any], name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The begin files and a manifest (for ``name``) of a push of the very files of ``record``."""
    manifest = dict(record["manifest"])
    files = [{"role": f.role, "name": f.name, "digest": f.digest, "size": f.size}
             for f in version_files(manifest)]
    return files, {**manifest, "name": name}


def _commit(api: str, name: str, number: int, manifest: dict[str, Any],
            token: str) -> httpx.Response:
    return httpx.post(f"{api}/models/{name}/pushes/{number}/commit", headers=_headers(token),
                      json={"manifest": {**manifest, "version": number}})


def test_a_push_does_not_tell_which_blobs_hidden_models_hold(
        scoped: tuple[Service, dict[str, str]]) -> None:
    """Knowing a hidden model's digests is not enough: a push listing them is asked to upload
    them as if absent, its commit without them fails as for a blob never uploaded, and other
    bytes are refused; with the bytes, the push is the token's own."""
    service, tokens = scoped
    api, mine = service.url + API, tokens["team-a"]
    record = httpx.get(f"{api}/resolve", params={"ref": HIDDEN},
                       headers=_headers(tokens["boss"])).json()
    files, manifest = _copy_of(record, "team-a-copy")
    shard = files[0]
    begun = httpx.post(f"{api}/models/team-a-copy/pushes", json={"files": files},
                       headers=_headers(mine))
    assert begun.status_code == 200, begun.text
    number, uploads = begun.json()["version"], begun.json()["uploads"]
    # Asked to upload, through the server (hashed before anything is placed), as if absent.
    assert [(u["digest"], u["direct"], u["url"]) for u in uploads] == [
        (shard["digest"], False, f"{API}/blobs/{shard['digest']}")]
    # A commit without the bytes answers as the commit of a blob never uploaded does.
    claimed = _commit(api, "team-a-copy", number, manifest, mine)
    absent_data = b"never uploaded" * 10
    absent = dict(shard, digest="sha256:" + hashlib.sha256(absent_data).hexdigest(),
                  size=len(absent_data))
    other = httpx.post(f"{api}/models/team-a-other/pushes", json={"files": [absent]},
                       headers=_headers(mine))
    other_manifest = {**manifest, "name": "team-a-other",
                      "files": [{**manifest["files"][0], "digest": absent["digest"],
                                 "size": absent["size"]}]}
    other_manifest["digest"] = version_digest([absent["digest"]])
    unsent = _commit(api, "team-a-other", other.json()["version"], other_manifest, mine)
    assert claimed.status_code == unsent.status_code == 404, (claimed.text, unsent.text)
    assert claimed.json()["error"]["code"] == unsent.json()["error"]["code"] == "blob_missing"
    assert claimed.text.replace(shard["digest"], "D").replace("team-a-copy", "N").replace(
        f"of {shard['size']} bytes", "of S bytes") == unsent.text.replace(
        absent["digest"], "D").replace("team-a-other", "N").replace(
        f"of {absent['size']} bytes", "of S bytes")
    # Other bytes are refused, and the stored blob is untouched.
    upload_headers = {**_headers(mine), "Content-Type": "application/octet-stream"}
    wrong = httpx.put(service.url + uploads[0]["url"], content=b"\0" * shard["size"],
                      headers=upload_headers)
    assert wrong.status_code == 422
    stored = httpx.get(f"{api}/blobs/{shard['digest']}", headers=_headers(tokens["boss"]))
    assert "sha256:" + hashlib.sha256(stored.content).hexdigest() == shard["digest"]
    assert _commit(api, "team-a-copy", number, manifest, mine).status_code == 404
    # The very bytes: the push commits, and its blob is now one the token may read.
    sent = httpx.put(service.url + uploads[0]["url"], content=stored.content,
                     headers=upload_headers)
    assert sent.status_code == 201, sent.text
    done = _commit(api, "team-a-copy", number, manifest, mine)
    assert done.status_code == 200, done.text
    assert httpx.get(f"{api}/blobs/{shard['digest']}", headers=_headers(mine)).content == \
        stored.content
    # A token over every model is told only what the store lacks.
    again = httpx.post(f"{api}/models/shared-copy/pushes", json={"files": files},
                       headers=_headers(tokens["boss"]))
    assert again.json()["uploads"] == []
    for name, begin in (("shared-copy", again), ("team-a-other", other)):
        httpx.delete(f"{api}/models/{name}/pushes/{begin.json()['version']}",
                     headers=_headers(tokens["boss"]))


def _export_record(data: bytes) -> dict[str, Any]:
    return {"format": "onnx", "key": hashlib.sha256(data + b"onnx").hexdigest(),
            "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data),
            "max_abs_diff": 0.0, "tolerance": 1e-4, "params": {}, "versions": {"torch": "2"},
            "created_at": "2026-01-01T00:00:00+00:00"}


def test_an_export_cannot_claim_a_hidden_models_blob_by_digest(
        scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api, boss, mine = service.url + API, _headers(tokens["boss"]), _headers(tokens["team-a"])
    data = b"\x08\x07" + hashlib.sha512(b"an onnx export of team b").digest() * 20
    record = _export_record(data)
    theirs = f"{api}/models/{HIDDEN}/versions/1/exports"
    first = httpx.post(theirs, json={"record": record}, headers=boss).json()
    put = httpx.put(service.url + first["uploads"][0]["url"], content=data,
                    headers={**boss, "Content-Type": "application/octet-stream"})
    assert put.status_code == 201, put.text
    assert httpx.post(theirs, json={"record": record}, headers=boss).json()["export"]
    blob = f"{api}/blobs/{record['digest']}"
    assert httpx.get(blob, headers=mine).status_code == 404
    # Registered for a model of its own by digest alone: asked for the bytes, every time.
    ours = f"{api}/models/{OWN}/versions/1/exports"
    for _ in range(2):
        asked = httpx.post(ours, json={"record": record}, headers=mine).json()
        assert asked["export"] is None
        assert [(u["digest"], u["direct"], u["url"]) for u in asked["uploads"]] == [
            (record["digest"], False, f"{API}/models/{OWN}/versions/1/exports/blobs/"
                                      f"{record['digest']}")]
    upload = {**mine, "Content-Type": "application/octet-stream"}
    wrong = httpx.put(service.url + asked["uploads"][0]["url"], content=b"\0" * len(data),
                      headers=upload)
    assert wrong.status_code == 422
    assert httpx.post(ours, json={"record": record}, headers=mine).json()["export"] is None
    assert httpx.get(blob, headers=mine).status_code == 404
    # With the very bytes it is the token's own export, and its blob one it may read.
    sent = httpx.put(service.url + asked["uploads"][0]["url"], content=data, headers=upload)
    assert sent.status_code == 201, sent.text
    kept = httpx.post(ours, json={"record": record}, headers=mine).json()
    assert kept["export"]["digest"] == record["digest"]
    assert httpx.get(blob, headers=mine).content == data


def test_a_limited_admin_is_admin_of_its_models_only(
        scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api, limited = service.url + API, _headers(tokens["team-a-admin"])
    for method, path in (("POST", "/gc"), ("POST", "/mlflow/sync"), ("GET", "/events"),
                         ("GET", "/webhooks")):
        response = httpx.request(method, api + path, headers=limited)
        assert response.status_code == 403, (path, response.text)
        assert "needs an admin token created without --models" in response.text
    assert httpx.post(api + "/gc", headers=_headers(tokens["boss"])).status_code == 200
    # Admin over its own models: it moves their aliases.
    moved = httpx.put(f"{api}/models/{OWN}/aliases/staging", json={"version": 1},
                      headers=limited)
    assert moved.status_code == 200 and moved.json()["aliases"] == ["staging"]


@pytest.mark.s3
def test_limited_tokens_on_an_s3_store(s3_endpoint: str, s3_store_url: str, home: Path,
                                       work: Path) -> None:
    """On a store that hands out presigned URLs a limited token still uploads new blobs straight
    to the bucket and commits without proofs, and is still asked to send, through the server,
    a blob only a hidden model holds; it may read neither that blob nor its URL."""
    from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET

    auth_file = work / "auth.json"
    boss_token = AuthFile(auth_file).create("boss", ["admin"])
    limited = AuthFile(auth_file).create("team-a", ["read", "write"], ("team-a-*",))
    with registry_server(home / "server", work, env_extra={
            "REGISTRY_AUTH_FILE": str(auth_file),
            "REGISTRY_STORE_URL": s3_store_url, "REGISTRY_S3_ENDPOINT_URL": s3_endpoint,
            "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}) as service:
        boss = registry.Registry(service.url, token=boss_token, home=home / "boss")
        team_a = registry.Registry(service.url, token=limited, home=home / "team-a")
        try:
            boss.push(trained_mlp(1), HIDDEN)
            mv = team_a.push(trained_mlp(2), OWN)
            assert mv.metadata["push"]["shards_uploaded"] == 1
            assert_same_state(team_a.pull_state_dict(OWN, device="cpu"),
                              trained_mlp(2).state_dict())
            api = service.url + API
            record = httpx.get(f"{api}/resolve", params={"ref": HIDDEN},
                               headers=_headers(boss_token)).json()
            files, _ = _copy_of(record, "team-a-copy")
            for suffix in ("/link", ""):
                response = httpx.get(f"{api}/blobs/{files[0]['digest']}{suffix}",
                                     headers=_headers(limited), follow_redirects=False)
                assert response.status_code == 404, response.text
            fresh = {"role": "file", "name": "notes.txt", "digest": "sha256:" + "cd" * 32,
                     "size": 10}
            begun = httpx.post(f"{api}/models/team-a-copy/pushes",
                               json={"files": [files[0], fresh]}, headers=_headers(limited))
            assert begun.status_code == 200, begun.text
            uploads = {u["digest"]: u for u in begun.json()["uploads"]}
            assert uploads[files[0]["digest"]]["direct"] is False
            assert uploads[fresh["digest"]]["direct"] is True  # a new blob: straight to S3
            httpx.delete(f"{api}/models/team-a-copy/pushes/{begun.json()['version']}",
                         headers=_headers(limited))
        finally:
            boss.close()
            team_a.close()
