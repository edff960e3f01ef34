"""The remote client: URI handling, failures that name their fix, and a server on an S3 store
where weights travel by presigned URL directly between the client and the object store."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import torch

import registry
from registry.errors import ServerUnavailableError, SettingsError
from tests.helpers import assert_same_state, trained_mlp
from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET
from tests.integration.serving import free_port, registry_server


@pytest.mark.parametrize("uri,message", [
    ("ftp://host/x", "is not an http(s) URL"),
    ("http://", "is not an http(s) URL"),
    ("registry.example:8080", "is not an http(s) URL"),
    ("http://alice:secret@host:8080", "put credentials in token=... or REGISTRY_TOKEN"),
])
def test_bad_uris_are_refused(uri: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        registry.Registry(uri)
    assert "secret" not in str(err.value)


def test_uri_and_local_parts_are_exclusive(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not both"):
        registry.Registry("http://127.0.0.1:1", store=(tmp_path / "objects").as_uri())


def test_registry_uri_selects_the_remote_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.http.remote import RemoteBackend

    monkeypatch.setenv("REGISTRY_URI", "http://127.0.0.1:9/")
    monkeypatch.setenv("REGISTRY_TOKEN", "reg_secret-token")
    reg = registry.Registry()
    assert isinstance(reg.backend, RemoteBackend)
    assert reg.backend.url == "http://127.0.0.1:9"
    assert "reg_secret-token" not in repr(reg) + repr(reg.backend)
    reg.close()


def test_unreachable_server_names_the_fix() -> None:
    port = free_port()  # nothing listens here
    reg = registry.Registry(f"http://127.0.0.1:{port}", token="reg_t")
    with pytest.raises(ServerUnavailableError, match=f"127.0.0.1:{port} is unreachable") as err:
        reg.list_models()
    assert "registry serve" in str(err.value) and "reg_t" not in str(err.value)
    reg.close()


@pytest.mark.s3
def test_server_on_s3_store_hands_out_presigned_urls(s3_endpoint: str, s3_store_url: str,
                                                      tmp_path: Path) -> None:
    env = {"REGISTRY_STORE_URL": s3_store_url, "REGISTRY_S3_ENDPOINT_URL": s3_endpoint,
           "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull,
           "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    with registry_server(tmp_path / "server-home", tmp_path, env_extra=env) as service:
        pusher = registry.Registry(service.url, home=tmp_path / "pusher")
        puller = registry.Registry(service.url, home=tmp_path / "puller")
        try:
            model = trained_mlp()
            mv = pusher.push(model, "on-s3", aliases=["production"])
            link = httpx.get(f"{service.url}/api/v1/blobs/{mv.digest}/link").json()
            assert link["direct"] is True and link["url"].startswith(s3_endpoint)
            state = puller.pull_state_dict("on-s3@production", device="cpu")
            assert_same_state({k: v for k, v in state.items() if isinstance(v, torch.Tensor)},
                              model.state_dict())
            # The bytes came from S3 into the puller's verified cache, not through the server.
            assert (tmp_path / "puller" / "cache" / "blobs" / "sha256" / mv.digest[7:]).exists()
            assert f"GET /api/v1/blobs/{mv.digest} " not in service.output()
            assert "PUT /api/v1/blobs/" not in service.output()  # the upload went direct too
            assert DUMMY_SECRET not in service.output()
            # A second pull reads no bytes from anywhere.
            before = service.output().count("/link")
            puller.pull_state_dict("on-s3:v1", device="cpu")
            assert service.output().count("/link") == before
        finally:
            pusher.close()
            puller.close()
