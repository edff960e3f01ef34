"""Bearer-token auth against the real CNCF distribution registry (``auth: token:``): the
registry challenges, the door fetches a JWT from the token server of ``oci_token.py`` with the
credentials of ``REGISTRY_OCI_AUTH`` or the docker config, and the registry verifies the JWT
(issuer, audience, times, signature up to its root bundle, the ``access`` claim) itself."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import registry
from registry import Registry
from tests.helpers import BlockLM, assert_same_state, block_lm
from tests.integration import oci_registry, oci_token
from tests.integration.oci_registry import OciRegistry
from tests.integration.oci_token import Signer, TokenServer

SHARD = "16KiB"
USER, PASSWORD = "alice", "s3cret-pw"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenServer]:
    signer = Signer.create(tmp_path_factory.mktemp("token-ca"))
    server = TokenServer(signer, {USER: PASSWORD}).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def oci_bearer(tmp_path_factory: pytest.TempPathFactory,
               tokens: TokenServer) -> Iterator[OciRegistry]:
    server = oci_registry.start(tmp_path_factory.mktemp("oci-bearer"),
                                token=tokens.registry_auth())
    yield server
    server.stop()


def _use(monkeypatch: pytest.MonkeyPatch, oci: OciRegistry, password: str = PASSWORD) -> None:
    monkeypatch.setenv("REGISTRY_OCI_AUTH", json.dumps(
        {oci.host: {"username": USER, "password": password}}))


def test_the_registry_demands_a_token_its_realm_issues(oci_bearer: OciRegistry,
                                                        tokens: TokenServer) -> None:
    """The fixture itself, spoken to by hand: the real registry challenges with the realm, and
    the token server's JWT is one it accepts (so the tests below test the door, not a typo)."""
    url = f"http://{oci_bearer.host}/v2/hand/lm/tags/list"
    challenge = httpx.get(url)
    assert challenge.status_code == 401
    assert challenge.headers["www-authenticate"] == (
        f'Bearer realm="{tokens.realm}",service="{oci_token.SERVICE}",'
        'scope="repository:hand/lm:pull"')
    answer = httpx.get(tokens.realm, params={"service": oci_token.SERVICE,
                                             "scope": "repository:hand/lm:pull"},
                       auth=(USER, PASSWORD))
    token = answer.json()["token"]
    # 404: past auth, and no such repository yet
    assert httpx.get(url, headers={"authorization": f"Bearer {token}"}).status_code == 404
    anonymous = httpx.get(tokens.realm, params={"service": oci_token.SERVICE,
                                                "scope": "repository:hand/lm:pull"}).json()
    refused = httpx.get(url, headers={"authorization": f"Bearer {anonymous['token']}"})
    assert refused.status_code == 401 and "insufficient_scope" in refused.headers[
        "www-authenticate"]


def test_push_and_pull_through_the_token_dance(reg: Registry, oci_bearer: OciRegistry,
                                               tokens: TokenServer,
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    model = block_lm()
    mv = reg.push(model, "lm", shard_size=SHARD)
    _use(monkeypatch, oci_bearer)
    asked, issued = len(tokens.requests), len(tokens.issued)
    done = Registry().push_oci("lm:v1", oci_bearer.ref("team/lm"))
    assert done.uploaded == done.layers > 2
    pushed = tokens.requests[asked:]
    # Every realm request carried the configured credentials, and each was granted.
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert pushed and {r["authorization"] for r in pushed} == {expected}
    grants = tokens.issued[issued:]
    assert len(grants) == len(pushed)
    assert {g["subject"] for g in grants} == {USER}
    granted = {(a["name"], action) for g in grants for a in g["access"] for action in a["actions"]}
    assert granted == {("team/lm", "pull"), ("team/lm", "push")}
    # Tokens are kept per scope: far fewer than the requests of a push with several layers.
    scopes = [tuple(r["query"]["scope"]) for r in pushed]
    assert len(scopes) == len(set(scopes))
    assert len(pushed) < done.layers

    before = len(tokens.issued)
    pulled = Registry(home=tmp_path / "fresh").pull(oci_bearer.ref("team/lm", "v1"),
                                                    device="cpu", model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())
    assert tokens.issued[before:] and all(
        a["actions"] == ["pull"] for g in tokens.issued[before:] for a in g["access"])

    copy = Registry(home=tmp_path / "imported").import_oci(oci_bearer.ref("team/lm", "v1"),
                                                           "lm-copy")
    assert copy.digest == mv.digest


def test_credentials_from_the_docker_config_reach_the_realm(
        reg: Registry, oci_bearer: OciRegistry, tokens: TokenServer,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model = block_lm(seed=1)
    reg.push(model, "lm", shard_size=SHARD)
    (tmp_path / "docker").mkdir()
    pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (tmp_path / "docker" / "config.json").write_text(json.dumps(
        {"auths": {f"http://{oci_bearer.host}": {"auth": pair}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    asked = len(tokens.requests)
    Registry().push_oci("lm:v1", oci_bearer.ref("docker/lm"))
    pulled = Registry(home=tmp_path / "fresh").pull(oci_bearer.ref("docker/lm", "v1"),
                                                    device="cpu", model=BlockLM)
    assert_same_state(pulled.state_dict(), model.state_dict())
    assert {r["user"] for r in tokens.requests[asked:]} == {USER}


def test_a_wrong_password_or_none_is_unauthorized(reg: Registry, oci_bearer: OciRegistry,
                                                  tokens: TokenServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    reg.push(block_lm(), "lm", shard_size=SHARD)
    _use(monkeypatch, oci_bearer, password="wrong-pw")
    asked = len(tokens.requests)
    with pytest.raises(registry.UnauthorizedError, match="token service refused") as caught:
        Registry().push_oci("lm:v1", oci_bearer.ref("wrong/lm"))
    assert "wrong-pw" not in str(caught.value)
    assert [r["user"] for r in tokens.requests[asked:]] == [False]  # asked once, refused
    monkeypatch.delenv("REGISTRY_OCI_AUTH")
    monkeypatch.setenv("DOCKER_CONFIG", str(reg.settings.home / "no-docker"))
    # Anonymous: the realm issues a token with no access; the registry refuses it.
    with pytest.raises(registry.UnauthorizedError, match="no credentials are configured"):
        Registry().pull(oci_bearer.ref("wrong/lm", "v1"), device="cpu", model=BlockLM)
    assert tokens.issued[-1] == {"subject": "", "access": []}


def test_a_realm_that_is_not_loopback_is_refused(
        reg: Registry, tokens: TokenServer, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry on loopback names a plain-HTTP realm on another address of this machine:
    the credentials are not sent there, and nothing is asked of it."""
    elsewhere = TokenServer(tokens.signer, {USER: PASSWORD},
                            address=oci_registry.non_loopback_address()).start()
    server = oci_registry.start(tmp_path_factory.mktemp("oci-far-realm"),
                                token=elsewhere.registry_auth())
    try:
        reg.push(block_lm(), "lm", shard_size=SHARD)
        _use(monkeypatch, server)
        with pytest.raises(registry.InsecureTransportError, match="token realm"):
            Registry().push_oci("lm:v1", server.ref("far/lm"))
        assert elsewhere.requests == []
    finally:
        server.stop()
        elsewhere.stop()
