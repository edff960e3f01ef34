"""Two server replicas on one PostgreSQL catalog and one bucket, each running the MLflow mirror:
version numbers stay unique and gap-free, and every version is mirrored exactly once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import registry
from registry.catalog.mirror import claim_token, live_claim
from registry.catalog.repository import Catalog
from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET
from tests.integration.serving import Service, registry_server, start_mlflow_server, stop_group

PUSHES_PER_REPLICA = 20


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return str(request.getfixturevalue("pg_url"))


def test_of_two_mirrors_that_read_the_same_state_exactly_one_claims_it(catalog_url: str,
                                                                       home: Path) -> None:
    reg = registry.Registry(catalog=catalog_url)
    reg.push({"w": torch.ones(3)}, "claimed")
    reg.close()
    first, second = Catalog(catalog_url, auto_migrate=True), Catalog(catalog_url)
    try:
        ((_, _, _, seen),) = first.mirror_states()
        assert seen is None
        a, b = claim_token("aaaa"), claim_token("bbbb")
        assert first.swap_mirror_state("claimed", 1, seen, a) is True
        assert second.swap_mirror_state("claimed", 1, seen, b) is False
        ((_, _, _, now),) = second.mirror_states()
        assert now == a and live_claim(now)
        assert not live_claim(claim_token("aaaa", now=time.time() - 3600))  # a dead worker's
        assert first.swap_mirror_state("claimed", 1, a, "fingerprint") is True
    finally:
        first.close()
        second.close()


@pytest.fixture
def mlflow(tmp_path: Path) -> Iterator[Service]:
    service = start_mlflow_server(tmp_path / "mlflow.db", tmp_path)
    yield service
    stop_group(service)


def _mlflow_versions(mlflow: Service, name: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{mlflow.url}/api/2.0/mlflow/model-versions/search",
                         params={"filter": f"name='{name}'", "max_results": 1000}, timeout=30)
    response.raise_for_status()
    versions: list[dict[str, Any]] = response.json().get("model_versions", [])
    for mv in versions:
        mv["tag_map"] = {t["key"]: t["value"] for t in mv.get("tags", [])}
    return versions


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.slow
def test_two_replicas_push_concurrently_and_mirror_each_version_once(
        pg_url: str, s3_store_url: str, s3_endpoint: str, mlflow: Service,
        tmp_path: Path) -> None:
    env = {"REGISTRY_CATALOG_URL": pg_url, "REGISTRY_STORE_URL": s3_store_url,
           "REGISTRY_S3_ENDPOINT_URL": s3_endpoint, "MLFLOW_TRACKING_URI": mlflow.url,
           "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET}
    with registry_server(tmp_path / "a", tmp_path, env_extra=env) as a, \
            registry_server(tmp_path / "b", tmp_path, env_extra=env) as b:
        pushed: dict[str, list[int]] = {a.url: [], b.url: []}
        errors: list[BaseException] = []

        def push_through(url: str, offset: int) -> None:
            reg = registry.Registry(url)
            try:
                for i in range(PUSHES_PER_REPLICA):
                    weights = {"w": torch.full((8,), float(offset + i))}
                    pushed[url].append(reg.push(weights, "replicated").version)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)
            finally:
                reg.close()

        threads = [threading.Thread(target=push_through, args=(a.url, 0)),
                   threading.Thread(target=push_through, args=(b.url, 1000))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not errors, errors
        total = 2 * PUSHES_PER_REPLICA
        assert sorted(pushed[a.url] + pushed[b.url]) == list(range(1, total + 1))
        assert pushed[a.url] and pushed[b.url]
        # Both replicas see the same 40 versions, each with the weights its pusher sent.
        for url in (a.url, b.url):
            reg = registry.Registry(url)
            try:
                assert [v.version for v in reg.list_versions("replicated")] == \
                    list(range(1, total + 1))
            finally:
                reg.close()

        deadline = time.monotonic() + 240
        versions: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            versions = _mlflow_versions(mlflow, "replicated")
            if len(versions) >= total and all(
                    v["tag_map"].get("registry.ref") for v in versions):
                break
            time.sleep(1)
        refs = sorted((v["tag_map"].get("registry.ref", "?") for v in versions),
                      key=lambda r: int(r.rsplit("v", 1)[-1]) if r[-1].isdigit() else -1)
        assert refs == [f"replicated:v{n}" for n in range(1, total + 1)], \
            f"MLflow holds {len(versions)} versions: {refs}"
        # Numbers stay aligned: MLflow version N mirrors replicated:vN.
        assert all(v["tag_map"]["registry.ref"] == f"replicated:v{v['version']}"
                   for v in versions)
        for service in (a, b):
            assert "Traceback" not in service.output()
