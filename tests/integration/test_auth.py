"""Tokens and scopes on a real `registry serve`: 401 without a valid token, 403 without the
scope, hashes only on disk, no token in logs or error messages."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import registry
from registry.errors import ForbiddenError, NotFoundError, SettingsError, UnauthorizedError
from server.auth import AuthFile, AuthPolicy, is_loopback, parse_scopes
from tests.helpers import assert_same_state, clean_env, run_cli, trained_mlp
from tests.integration.serving import Service, free_port, registry_exe, registry_server

SCOPES = {"reader": "read", "writer": "read,write", "boss": "admin"}


def _create(home: Path, auth_file: Path, name: str, scopes: str) -> str:
    result = run_cli("token", "create", name, "--scopes", scopes, "--auth-file", str(auth_file),
                     env=clean_env(home), check=True)
    token = result.stdout.strip()
    assert token.startswith("reg_") and "\n" not in token
    return token


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, dict[str, str]]]:
    root = tmp_path_factory.mktemp("auth")
    auth_file = root / "auth.json"
    # One token through the real CLI, the rest in-process (each CLI start imports torch).
    tokens = {"reader": _create(root / "home", auth_file, "reader", SCOPES["reader"])}
    tokens.update({name: AuthFile(auth_file).create(name, parse_scopes(scopes))
                   for name, scopes in SCOPES.items() if name != "reader"})
    with registry_server(root / "home", root, env_extra={"REGISTRY_AUTH_FILE": str(auth_file)}) \
            as service:
        service.auth_file = auth_file  # type: ignore[attr-defined]
        yield service, tokens


def test_auth_file_holds_hashes_only(secured: tuple[Service, dict[str, str]]) -> None:
    service, tokens = secured
    text = service.auth_file.read_text()  # type: ignore[attr-defined]
    data = json.loads(text)
    assert sorted(e["name"] for e in data["tokens"]) == sorted(SCOPES)
    for name, token in tokens.items():
        assert token not in text
        entry = next(e for e in data["tokens"] if e["name"] == name)
        assert entry["sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert service.auth_file.stat().st_mode & 0o077 == 0  # type: ignore[attr-defined]


def test_missing_and_wrong_tokens_get_401(secured: tuple[Service, dict[str, str]]) -> None:
    service, tokens = secured
    bare = httpx.get(service.url + "/api/v1/models")
    assert bare.status_code == 401
    assert bare.headers["www-authenticate"] == "Bearer"
    assert bare.json()["error"]["code"] == "unauthorized"
    for reg in (registry.Registry(service.url), registry.Registry(service.url, token="reg_nope")):
        with pytest.raises(UnauthorizedError):
            reg.list_models()
        reg.close()
    assert httpx.get(service.url + "/healthz").status_code == 200  # health needs no token


def test_scopes_are_enforced(secured: tuple[Service, dict[str, str]]) -> None:
    service, tokens = secured
    reader = registry.Registry(service.url, token=tokens["reader"])
    writer = registry.Registry(service.url, token=tokens["writer"])
    boss = registry.Registry(service.url, token=tokens["boss"])
    try:
        with pytest.raises(ForbiddenError, match="token 'reader' has scopes read; this request "
                                                 "needs write"):
            reader.push(trained_mlp(), "scoped")
        mv = writer.push(trained_mlp(), "scoped")
        assert reader.show("scoped").digest == mv.digest
        with pytest.raises(ForbiddenError, match="needs write"):
            reader.set_alias("scoped", "production", 1)
        with pytest.raises(ForbiddenError, match="needs admin"):
            writer.gc()
        assert boss.gc().kept >= 1  # admin implies read and write too
        assert boss.set_alias("scoped", "production", 1).aliases == ["production"]
    finally:
        for reg in (reader, writer, boss):
            reg.close()


def test_registry_token_env_is_used_by_module_functions(
        secured: tuple[Service, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    service, tokens = secured
    monkeypatch.setenv("REGISTRY_URI", service.url)
    monkeypatch.setenv("REGISTRY_TOKEN", tokens["reader"])
    assert "scoped" in registry.list_models()
    # REGISTRY_TOKEN is never sent to a URI passed in code.
    other = registry.Registry(service.url.replace("127.0.0.1", "localhost"))
    with pytest.raises(UnauthorizedError):
        other.list_models()
    other.close()


def test_tokens_never_reach_logs_or_errors(secured: tuple[Service, dict[str, str]]) -> None:
    service, tokens = secured
    wrong = "reg_" + "x" * 43
    response = httpx.get(service.url + "/api/v1/models",
                         headers={"Authorization": f"Bearer {wrong}"})
    assert wrong not in response.text
    reader = registry.Registry(service.url, token=tokens["reader"])
    assert tokens["reader"] not in repr(reader.backend)
    reader.close()
    log = service.output()
    assert "GET /api/v1/models" in log  # the access log is there, and clean
    for token in [*tokens.values(), wrong]:
        assert token not in log


def test_revoked_token_is_refused_without_restart(
        secured: tuple[Service, dict[str, str]], tmp_path: Path) -> None:
    service, _ = secured
    auth_file = service.auth_file  # type: ignore[attr-defined]
    temp = AuthFile(auth_file).create("temporary", ["read"])
    assert httpx.get(service.url + "/api/v1/models",
                     headers={"Authorization": f"Bearer {temp}"}).status_code == 200
    revoked = run_cli("token", "revoke", "temporary", "--auth-file", str(auth_file),
                      env=clean_env(tmp_path / "home"), check=True)
    assert "revoked token 'temporary'" in revoked.stdout
    time.sleep(0.05)
    assert httpx.get(service.url + "/api/v1/models",
                     headers={"Authorization": f"Bearer {temp}"}).status_code == 401
    again = run_cli("token", "revoke", "temporary", "--auth-file", str(auth_file),
                    env=clean_env(tmp_path / "home"))
    assert again.returncode == 2
    assert "no token named 'temporary'" in again.stderr


def test_token_create_refuses_duplicates_and_bad_scopes(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home")
    auth_file = tmp_path / "auth.json"
    _create(tmp_path / "home", auth_file, "ci", "read")
    dup = run_cli("token", "create", "ci", "--auth-file", str(auth_file), env=env)
    assert dup.returncode == 2 and "already exists" in dup.stderr and dup.stdout == ""
    bad = run_cli("token", "create", "other", "--scopes", "read,root", "--auth-file",
                  str(auth_file), env=env)
    assert bad.returncode == 2 and "unknown scope 'root'" in bad.stderr
    # Without --auth-file the default is $REGISTRY_HOME/auth.json.
    made = run_cli("token", "create", "y", env=env, check=True)
    assert made.stdout.strip() and (tmp_path / "home" / "auth.json").exists()


def test_public_host_without_auth_file_refuses_to_start(tmp_path: Path) -> None:
    result = subprocess.run([*registry_exe(), "serve", "--host", "0.0.0.0", "--port",
                             str(free_port())], env=clean_env(tmp_path / "home"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "refusing to serve on non-loopback host '0.0.0.0' without an auth file" in \
        result.stderr
    assert "--allow-anonymous" in result.stderr


def test_anonymous_server_serves_reads_and_refuses_writes(tmp_path: Path) -> None:
    embedded = registry.Registry(home=tmp_path / "home")
    embedded.push(trained_mlp(), "public")
    embedded.close()
    with registry_server(tmp_path / "home", tmp_path, "--allow-anonymous") as service:
        anonymous = registry.Registry(service.url)
        try:
            assert anonymous.list_models() == ["public"]
            assert anonymous.pull_state_dict("public", device="cpu")
            with pytest.raises(ForbiddenError, match="anonymous reads only"):
                anonymous.push(trained_mlp(), "public")
        finally:
            anonymous.close()


def test_open_loopback_server_warns(tmp_path: Path) -> None:
    with registry_server(tmp_path / "home", tmp_path) as service:
        assert httpx.get(service.url + "/api/v1/models").status_code == 200
        deadline = time.monotonic() + 10
        while "open to anyone" not in service.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "WARNING" in service.output() and "open to anyone" in service.output()


@pytest.mark.parametrize("host,loopback", [("127.0.0.1", True), ("::1", True),
                                           ("localhost", True), ("0.0.0.0", False),
                                           ("10.0.0.5", False), ("example.com", False)])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    if not loopback:
        with pytest.raises(registry.SettingsError, match="refusing to serve"):
            AuthPolicy.for_server(host, auth_file=None, allow_anonymous=False)


def test_a_named_auth_file_that_is_missing_stops_the_server(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    env = clean_env(tmp_path / "home", REGISTRY_AUTH_FILE=str(missing))
    result = subprocess.run([*registry_exe(), "serve", "--port", str(free_port())], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2  # never a silently open server
    assert f"REGISTRY_AUTH_FILE {missing} does not exist" in result.stderr


# -- per-model scopes (--models) ---------------------------------------------------------------

def test_a_token_limited_to_team_a_models(secured: tuple[Service, dict[str, str]],
                                          tmp_path: Path) -> None:
    """Made by the real CLI, a `--models 'team-a-*'` token pushes and pulls team-a models and
    finds no other: NotFoundError as for a missing model, and lists without them."""
    service, tokens = secured
    auth_file = service.auth_file  # type: ignore[attr-defined]
    env = clean_env(tmp_path / "home")
    made = run_cli("token", "create", "team-a-ci", "--scopes", "read,write", "--models",
                   "team-a-*, shared", "--auth-file", str(auth_file), env=env, check=True)
    limited = made.stdout.strip()
    assert "models team-a-*,shared" in made.stderr
    boss = registry.Registry(service.url, token=tokens["boss"], home=tmp_path / "boss")
    team_a = registry.Registry(service.url, token=limited, home=tmp_path / "team-a")
    try:
        boss.push(trained_mlp(1), "team-b-y", aliases=["production"])
        mv = team_a.push(trained_mlp(2), "team-a-x")
        assert_same_state(team_a.pull_state_dict("team-a-x", device="cpu"),
                          trained_mlp(2).state_dict())
        assert team_a.list_models() == ["team-a-x"]
        assert "team-b-y" in boss.list_models() and "team-a-x" in boss.list_models()
        for ref in ("team-b-y", "team-b-y:v1", "team-b-y@production"):
            with pytest.raises(NotFoundError) as hidden:
                team_a.show(ref)
            with pytest.raises(NotFoundError) as missing:
                team_a.show(ref.replace("team-b-y", "team-b-zzz"))
            assert str(hidden.value).replace("team-b-y", "N") == \
                str(missing.value).replace("team-b-zzz", "N")
            assert "latest is" not in str(hidden.value)
        with pytest.raises(NotFoundError):
            team_a.pull_state_dict("team-b-y", device="cpu")
        with pytest.raises(NotFoundError):
            team_a.push(trained_mlp(3), "team-b-y")
        with pytest.raises(NotFoundError):
            team_a.set_alias("team-b-y", "production", 1)
        assert boss.show("team-b-y@production").version == 1
        assert boss.show("team-a-x").digest == mv.digest
    finally:
        boss.close()
        team_a.close()
    listed = run_cli("token", "ls", "--auth-file", str(auth_file), env=env, check=True)
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert listed.stdout.splitlines()[0].split() == ["NAME", "SCOPES", "MODELS", "CREATED"]
    assert rows["team-a-ci"][1:3] == ["read,write", "team-a-*,shared"]
    assert rows["boss"][1:3] == ["admin", "*"]
    assert limited not in listed.stdout
    as_json = run_cli("token", "ls", "--json", "--auth-file", str(auth_file), env=env,
                      check=True)
    entries = {e["name"]: e for e in map(json.loads, as_json.stdout.splitlines())}
    assert entries["team-a-ci"]["models"] == ["team-a-*", "shared"]
    assert entries["boss"]["models"] is None and "sha256" not in entries["boss"]
    AuthFile(auth_file).revoke("team-a-ci")


def test_bad_model_patterns_are_refused_naming_them(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "home")
    auth_file = tmp_path / "auth.json"
    for patterns, says in (("Team-A-*", "invalid model pattern 'Team-A-*'"),
                           ("team-a-*,^team.*$", "invalid model pattern '^team.*$'"),
                           (",", "no model patterns given"),
                           ("x" * 129, "invalid model pattern"),
                           (",".join(f"m{i}" for i in range(40)), "at most 32")):
        bad = run_cli("token", "create", "ci", "--models", patterns, "--auth-file",
                      str(auth_file), env=env)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr
        assert bad.stdout == "" and not auth_file.exists()
    # A hand-edited file with a bad pattern is refused at start, naming the token.
    auth_file.write_text(json.dumps({"tokens": [{"name": "ci", "sha256": "0" * 64,
                                                 "scopes": ["read"], "models": ["a/(b"]}]}))
    with pytest.raises(SettingsError, match="token 'ci': invalid model pattern 'a/\\(b'"):
        AuthPolicy.for_server("127.0.0.1", auth_file=auth_file, allow_anonymous=False)


def test_an_auth_file_written_before_model_scopes_means_all_models(tmp_path: Path) -> None:
    """A file of the old shape (no "models") still serves every model to its tokens."""
    token = "reg_" + "o" * 43
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps({"tokens": [{
        "name": "old", "sha256": hashlib.sha256(token.encode()).hexdigest(),
        "scopes": ["read", "write"], "created_at": "2026-11-01T00:00:00+00:00"}]}))
    with registry_server(tmp_path / "home", tmp_path,
                         env_extra={"REGISTRY_AUTH_FILE": str(auth_file)}) as service:
        old = registry.Registry(service.url, token=token, home=tmp_path / "client")
        try:
            old.push(trained_mlp(), "team-a-x")
            old.push(trained_mlp(1), "team-b-y")
            assert old.list_models() == ["team-a-x", "team-b-y"]
            assert old.show("team-b-y").version == 1
        finally:
            old.close()
    listed = run_cli("token", "ls", "--auth-file", str(auth_file),
                     env=clean_env(tmp_path / "home"), check=True)
    assert listed.stdout.splitlines()[1].split()[:3] == ["old", "read,write", "*"]
