"""Per-model token scopes on a real `registry serve`: a token limited to ``team-a-*`` cannot tell
a model it may not see from one that does not exist, on every route that names a model (the
matrix is built from the server's own routes, so a new route is covered or this fails), nor
reach another model's blobs by digest, nor learn from a push which blobs others hold."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

import registry
from server.app import ROUTERS
from server.auth import AuthFile, parse_model_patterns, parse_scopes
from tests.helpers import trained_mlp
from tests.integration.serving import Service, registry_server

API = "/api/v1"
HIDDEN, MISSING, OWN, OWN_MISSING = "team-b-y", "team-b-zzz", "team-a-x", "team-a-zzz"
TOKENS = {  # name: (scopes, model patterns)
    "boss": ("admin", None),
    "team-a": ("read,write", "team-a-*,shared"),
    "team-a-admin": ("admin", "team-a-*"),
    "team-a-reader": ("read", "team-a-*"),
}
# A value for each path parameter other than {name} (an existing version, alias, digest).
FILLERS = {"version": "1", "alias": "prod", "digest": "sha256:" + "ab" * 32}


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
            if isinstance(route, APIRoute) and "{name}" in route.path:
                found.extend((method, route.path) for method in sorted(route.methods))
    return found


def _fill(path: str, name: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: name if m[1] == "name" else FILLERS[m[1]], path)


def _answer(response: httpx.Response, name: str) -> tuple[int, Any]:
    """Status and body with the model name taken out: what must not differ."""
    body = response.json() if response.content else None
    text = str(body).replace(name, "NAME")
    return response.status_code, text


def test_the_matrix_covers_the_routes_that_name_a_model() -> None:
    routes = _model_routes()
    paths = {path for _, path in routes}
    # The routes of this server that take a model (a new one joins the matrix by itself).
    for expected in (f"{API}/models/{{name}}/versions", f"{API}/models/{{name}}/pushes",
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
        if token == "team-a-reader" and method != "GET":
            assert answers[0][0] == 403  # the scope is checked first, the same for both
        else:
            assert answers[0][0] == 404, answers
            assert "not_found" in answers[0][1]


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


def test_a_push_does_not_tell_which_blobs_hidden_models_hold(
        scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api = service.url + API
    record = httpx.get(f"{api}/resolve", params={"ref": HIDDEN},
                       headers=_headers(tokens["boss"])).json()
    shard = record["manifest"]["files"][0]
    files = [{"name": "model.safetensors", "digest": shard["digest"], "size": shard["size"]}]
    begun = httpx.post(f"{api}/models/team-a-copy/pushes", json={"files": files},
                       headers=_headers(tokens["team-a"]))
    assert begun.status_code == 200, begun.text
    uploads = begun.json()["uploads"]
    # Asked to upload, through the server (hashed before anything is placed), as if absent.
    assert [(u["digest"], u["direct"], u["url"]) for u in uploads] == [
        (shard["digest"], False, f"{API}/blobs/{shard['digest']}")]
    # Sending other bytes is refused and the stored blob is untouched.
    wrong = httpx.put(service.url + uploads[0]["url"], content=b"\0" * shard["size"],
                      headers={**_headers(tokens["team-a"]),
                               "Content-Type": "application/octet-stream"})
    assert wrong.status_code == 422
    stored = httpx.get(f"{api}/blobs/{shard['digest']}", headers=_headers(tokens["boss"]))
    assert "sha256:" + hashlib.sha256(stored.content).hexdigest() == shard["digest"]
    httpx.delete(f"{api}/models/team-a-copy/pushes/{begun.json()['version']}",
                 headers=_headers(tokens["team-a"]))
    # A token over every model is told only what the store lacks.
    again = httpx.post(f"{api}/models/shared-copy/pushes", json={"files": files},
                       headers=_headers(tokens["boss"]))
    assert again.json()["uploads"] == []
    httpx.delete(f"{api}/models/shared-copy/pushes/{again.json()['version']}",
                 headers=_headers(tokens["boss"]))


def test_a_limited_admin_is_admin_of_its_models_only(
        scoped: tuple[Service, dict[str, str]]) -> None:
    service, tokens = scoped
    api, limited = service.url + API, _headers(tokens["team-a-admin"])
    for path in ("/gc", "/mlflow/sync"):
        response = httpx.post(api + path, headers=limited)
        assert response.status_code == 403, response.text
        assert "needs an admin token created without --models" in response.text
    assert httpx.post(api + "/gc", headers=_headers(tokens["boss"])).status_code == 200
    # Admin over its own models: it moves their aliases.
    moved = httpx.put(f"{api}/models/{OWN}/aliases/staging", json={"version": 1},
                      headers=limited)
    assert moved.status_code == 200 and moved.json()["aliases"] == ["staging"]
