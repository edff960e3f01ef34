"""The deployment docs/deployment.md describes, under a kill and an outage: two `registry serve`
replicas over one PostgreSQL catalog and one S3 bucket (moto behind tests/faults/proxy.py),
clients pushing to one name with an alias through both. Mid-run the store goes away for
1.5 s from the first connection it refuses (shorter than REGISTRY_STORE_RETRY_SECONDS), then
one replica is SIGKILLed; its clients go on through the other.

Afterwards: every push reported as committed is visible under the number it was told, with its
weights; every visible version was reported as committed (or its client was told the outcome
was unknown, naming the check); the store holds a manifest for exactly the visible versions
(after a gc of what the killed replica left); gc leaves no orphan blob; `db rebuild` restores
exactly the catalog.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry import manifest as mf
from registry.backends import LocalBackend
from registry.errors import RegistryError, ServerUnavailableError
from tests.faults.invariants import no_orphans, rebuild_agrees
from tests.faults.proxy import FaultProxy
from tests.integration.conftest import DUMMY_KEY_ID, DUMMY_SECRET
from tests.integration.serving import start_registry_server

pytestmark = [pytest.mark.faults, pytest.mark.s3, pytest.mark.postgres]

CLIENTS_PER_REPLICA = 2
PUSHES_PER_CLIENT = 5
JOIN_S = 120


def _weights(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((64, 64), float(seed)), "b": torch.arange(16) + seed}


def test_two_replicas_survive_a_kill_and_a_store_outage_with_exact_outcomes(
        pg_url: str, s3_store_url: str, s3_endpoint: str, tmp_path: Path) -> None:
    proxy = FaultProxy(s3_endpoint)
    env = {"REGISTRY_CATALOG_URL": pg_url, "REGISTRY_STORE_URL": s3_store_url,
           "REGISTRY_S3_ENDPOINT_URL": proxy.url, "AWS_ACCESS_KEY_ID": DUMMY_KEY_ID,
           "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET, "REGISTRY_GC_GRACE": "6h"}
    started: dict[str, Any] = {}
    starters = [threading.Thread(target=lambda n=n: started.__setitem__(
        n, start_registry_server(tmp_path / n, tmp_path, env_extra=env))) for n in "ab"]
    for t in starters:
        t.start()
    for t in starters:
        t.join()
    a, b = started["a"], started["b"]
    # seed -> (version told, or None) and the error of a push that raised
    told: dict[int, int] = {}
    switched: list[int] = []  # clients of the killed replica that went on through the other
    unknown: dict[int, str] = {}  # the client was told the outcome is unknown
    failed: dict[int, str] = {}
    lock = threading.Lock()
    b_pushed = threading.Event()
    committed = threading.Event()

    def client(first: str, index: int) -> None:
        url = first
        for i in range(PUSHES_PER_CLIENT):
            seed = index * 100 + i
            for _attempt in range(2):  # a dead replica: the client goes on through the other
                reg = registry.Registry(url)
                try:
                    v = reg.push(_weights(seed), "fleet", aliases=["newest"],
                                 tags={"seed": str(seed)})
                    with lock:
                        told[seed] = v.version
                    committed.set()
                    if url == b.url:
                        b_pushed.set()
                    break
                except ServerUnavailableError as exc:
                    with lock:
                        if "may have gone through" in str(exc):
                            unknown[seed] = str(exc)
                            break
                    url = a.url
                    with lock:
                        switched.append(seed)
                except RegistryError as exc:
                    with lock:
                        failed[seed] = f"{type(exc).__name__}: {exc}"
                    break
                finally:
                    reg.close()

    threads = [threading.Thread(target=client, args=(url, n * CLIENTS_PER_REPLICA + k))
               for n, url in enumerate((a.url, b.url)) for k in range(CLIENTS_PER_REPLICA)]
    try:
        for t in threads:
            t.start()
        # The outage, once pushes are under way: 1.5 s from the first connection it refuses
        # (within the 5 s retry window, so no push may fail of it).
        assert committed.wait(JOIN_S), "no push committed"
        proxy.outage()
        deadline = time.monotonic() + JOIN_S
        while proxy.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(1.5)
        proxy.heal()
        assert b_pushed.wait(JOIN_S), "no push through replica b committed"
        b.proc.send_signal(signal.SIGKILL)  # mid-run: its clients may be anywhere in a push
        for t in threads:
            t.join(JOIN_S)
        assert not any(t.is_alive() for t in threads), "a client hung"
    finally:
        proxy.heal()
        a.stop()
        b.stop()
        proxy.close()

    print(f"[faults] deployment: pushes told committed={len(told)} outcome unknown="
          f"{len(unknown)} retried through the other replica={len(switched)} connections the "
          f"outage refused={proxy.refused}")
    assert proxy.refused > 0, "the outage struck no connection"
    assert failed == {}, failed
    # An embedded registry on the same catalog and bucket, straight at moto (grace 0 here).
    reg = registry.Registry(catalog=pg_url, store=s3_store_url)
    backend: LocalBackend = reg.backend  # type: ignore[assignment]
    try:
        visible = {int(r.tags["seed"]): r.version for r in backend.list_versions("fleet")}
        # Exact outcomes: what a client was told is what the catalog says.
        assert {s: v for s, v in visible.items() if s in told} == told
        assert set(visible) - set(told) <= set(unknown), "a visible version nobody was told of"
        assert len(set(visible.values())) == len(visible)  # no duplicate of a retried push
        for seed, version in visible.items():
            pulled = reg.pull_state_dict(f"fleet:v{version}", device="cpu")
            assert torch.equal(pulled["w"], _weights(seed)["w"]), f"fleet:v{version}"
        assert reg.show("fleet@newest").version in visible.values()
        backend.gc()  # the killed replica's reservation and owed writes
        stored = {k for k in backend.store.list("manifests/fleet/") if k.endswith(".json")}
        assert stored == {mf.manifest_key("fleet", v) for v in visible.values()}
        assert no_orphans(backend) == []
        assert rebuild_agrees(backend) == []
    finally:
        reg.close()
