"""The S3 endpoint goes away (tests/faults/proxy.py's ``outage``: every connection refused or
cut) at each step of a push, for a blip, and for good.

- A blip shorter than REGISTRY_STORE_RETRY_SECONDS is invisible: the push and the pull that
  overlap it succeed.
- An outage that starts at any one of a push's store operations and outlasts the window
  leaves an exact outcome: the push either fails typed and nothing of it is visible, or it
  succeeded (the catalog committed) and says so; afterwards gc leaves no orphan blob and no
  manifest of a version that is not visible, and `db rebuild` restores exactly the catalog.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import registry
from registry import manifest as mf
from registry.errors import RegistryError, StoreUnavailableError
from tests.faults.invariants import Tally, after_fault, local
from tests.faults.proxy import FaultProxy
from tests.faults.worker import build, same_weights

pytestmark = [pytest.mark.faults, pytest.mark.s3]

_NETWORK = ("has", "put_file", "put_bytes", "get_bytes", "get_to_file", "delete", "list",
            "modified", "touch")


class OutageAt:
    """A store that starts the proxy's outage right before its ``at``-th network call."""

    def __init__(self, inner: Any, proxy: FaultProxy) -> None:
        self._inner, self._proxy = inner, proxy
        self.calls: list[str] = []
        self.at: int | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _NETWORK:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.at is not None and len(self.calls) == self.at:
                self._proxy.outage()
            self.calls.append(name)
            return attr(*args, **kwargs)
        return counted


@pytest.fixture
def proxied(s3_endpoint: str, s3_store_url: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultProxy, registry.Registry]]:
    proxy = FaultProxy(s3_endpoint)
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("REGISTRY_STORE_URL", s3_store_url)
    reg = registry.Registry()
    yield proxy, reg
    reg.close()
    proxy.close()


def test_a_blip_shorter_than_the_retry_window_is_invisible(
        proxied: tuple[FaultProxy, registry.Registry]) -> None:
    proxy, reg = proxied
    proxy.outage()
    threading.Timer(1.0, proxy.heal).start()  # the default window is 5 s
    v1 = reg.push(build(1), "blip")
    backend = local(reg)
    # A cold pull (the cache emptied) downloads through the next blip.
    shutil.rmtree(backend.cache.root / "blobs", ignore_errors=True)
    shutil.rmtree(backend.cache.root / "verified", ignore_errors=True)
    proxy.outage()
    threading.Timer(1.0, proxy.heal).start()
    assert same_weights(reg.pull_state_dict(v1.ref, device="cpu"), 1)


def test_a_dead_store_is_a_typed_store_error(proxied: tuple[FaultProxy, registry.Registry],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, _ = proxied
    monkeypatch.setenv("REGISTRY_STORE_RETRY_SECONDS", "0.5")
    reg = registry.Registry()
    proxy.outage()
    with pytest.raises(StoreUnavailableError, match="unreachable"):
        reg.push(build(2), "dead")
    proxy.heal()
    assert reg.list_models() == []
    reg.close()


def test_an_outage_at_each_step_of_a_push_leaves_an_exact_outcome(
        proxied: tuple[FaultProxy, registry.Registry], monkeypatch: pytest.MonkeyPatch) -> None:
    proxy, _ = proxied
    monkeypatch.setenv("REGISTRY_STORE_RETRY_SECONDS", "0.3")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    reg = registry.Registry()
    backend = local(reg)
    store = OutageAt(backend.store, proxy)
    backend.store = store  # type: ignore[assignment]
    reg.push(build(0), "steps", aliases=["prod"], tags={"seed": "0"})
    store.calls.clear()
    reg.push(build(1), "steps", aliases=["prod"], tags={"seed": "1"})
    steps = list(store.calls)  # every network call of one push (its count, in order)
    assert "put_file" in steps and "put_bytes" in steps
    tally = Tally("store outage at each step of a push")
    seed = 10
    for at, step in enumerate(steps):
        store.calls.clear()
        store.at = at
        before = {r.version for r in backend.list_versions("steps")}
        try:
            v = reg.push(build(seed), "steps", aliases=["prod"], tags={"seed": str(seed)})
            outcome = "succeeded"
        except RegistryError as exc:
            v, outcome = None, type(exc).__name__
        finally:
            store.at = None
            proxy.heal()
        found: list[str] = []
        after = {r.version for r in backend.list_versions("steps")}
        if v is None:
            if after != before:
                found.append(f"a failed push left {sorted(after - before)} visible")
        elif v.version not in after or not same_weights(
                reg.pull_state_dict(v.ref, device="cpu"), seed):
            found.append(f"{v.ref} reported success but is not visible and whole")
        found += after_fault(reg, "steps", seed + 1)
        stored = {k for k in backend.store.list("manifests/steps/") if k.endswith(".json")}
        visible = {mf.manifest_key("steps", r.version) for r in backend.list_versions("steps")}
        found += [f"manifest of a version not visible: {k}" for k in sorted(stored - visible)]
        tally.record(f"outage at call {at} ({step}): {outcome}", found, note=outcome)
        seed += 2
    tally.check()


def test_the_retry_window_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.settings import Settings
    from registry.store import open_store

    env = {"REGISTRY_STORE_URL": "s3://some-bucket/x", "REGISTRY_STORE_RETRY_SECONDS": "2"}
    settings = Settings.from_env(env)
    assert open_store(settings.store_url, settings).retry_seconds == 2  # type: ignore[attr-defined]
    assert Settings.from_env({}).store_retry.total_seconds() == 5
    with pytest.raises(registry.SettingsError, match="REGISTRY_STORE_RETRY_SECONDS"):
        Settings.from_env({**env, "REGISTRY_STORE_RETRY_SECONDS": "a while"})
