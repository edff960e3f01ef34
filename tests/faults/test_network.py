"""A cut or stalled S3 connection mid-upload and mid-download (tests/faults/proxy.py between
the registry and moto): the push or pull fails with a typed RegistryError within a bounded
time, nothing is half visible, and once the link is healthy the next push and pull work.

The S3 store's timeouts are constants (registry/store/s3.py: connect 10 s, read 60 s; only the
attempts have a knob, AWS_MAX_ATTEMPTS), so the stall trials shorten them in-process."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

import registry
from registry.errors import RegistryError
from registry.store import s3 as s3_module
from tests.faults.invariants import Tally, after_fault
from tests.faults.proxy import FaultProxy
from tests.faults.worker import build

pytestmark = [pytest.mark.faults, pytest.mark.s3]

# Bytes forwarded before the fault: inside the request headers, early and late in the body of
# a shard of 263 KB (a GET's answer for "down").
CUT_AFTER = [300, 20_000, 150_000]
STALL_AFTER = [20_000, 150_000]
TIMEOUT_S = 2
BOUND_S = 45  # attempts x (timeout + backoff), s3transfer's own download retries included


@pytest.fixture
def proxied(s3_endpoint: str, s3_store_url: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultProxy, registry.Registry]]:
    proxy = FaultProxy(s3_endpoint)
    monkeypatch.setenv("REGISTRY_S3_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("REGISTRY_STORE_URL", s3_store_url)
    monkeypatch.setenv("REGISTRY_SHARD_SIZE", "512KiB")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    # The faults here last as long as the action: a short retry window keeps trials bounded
    # (tests/faults/test_outage.py shows a blip within the default window is ridden out).
    monkeypatch.setenv("REGISTRY_STORE_RETRY_SECONDS", "0.5")
    monkeypatch.setattr(s3_module, "READ_TIMEOUT_S", TIMEOUT_S)
    monkeypatch.setattr(s3_module, "CONNECT_TIMEOUT_S", TIMEOUT_S)
    reg = registry.Registry()
    yield proxy, reg
    reg.close()
    proxy.close()


def _attempt(proxy: FaultProxy, mode: str, direction: str, after: int,
             action: object) -> tuple[list[str], str]:
    """Run ``action`` under the fault; the violations and the outcome's name."""
    proxy.fault(mode, direction, after)
    start = time.monotonic()
    try:
        action()  # type: ignore[operator]
        outcome, found = "succeeded", [] if proxy.hits == 0 else [
            "the transfer succeeded through a faulted connection"]
    except RegistryError as exc:
        outcome, found = type(exc).__name__, []
    except Exception as exc:  # noqa: BLE001  (an untyped error is what this looks for)
        outcome, found = type(exc).__name__, [f"untyped {type(exc).__name__}: {exc}"]
    finally:
        proxy.heal()
    elapsed = time.monotonic() - start
    if elapsed > BOUND_S:
        found.append(f"took {elapsed:.1f}s (bound {BOUND_S}s)")
    if proxy.hits == 0:
        found.append("the fault never struck (no blob transfer reached that many bytes)")
    return found, outcome


def _cold_cache(reg: registry.Registry) -> None:
    root = reg.backend.cache.root  # type: ignore[attr-defined]
    for sub in ("blobs", "verified"):
        shutil.rmtree(root / sub, ignore_errors=True)


@pytest.mark.parametrize("mode", ["cut", "stall"])
def test_a_faulted_upload_fails_typed_and_leaves_nothing(
        mode: str, proxied: tuple[FaultProxy, registry.Registry]) -> None:
    proxy, reg = proxied
    tally = Tally(f"{mode} S3 connection mid-upload")
    seen: dict[str, str] = {}
    for i, after in enumerate(CUT_AFTER if mode == "cut" else STALL_AFTER):
        seed = 100 + i
        found, outcome = _attempt(proxy, mode, "up", after, lambda s=seed: reg.push(
            build(s), "net", tags={"seed": str(s)}, aliases=["production"]))
        found += after_fault(reg, "net", next_seed=500 + i, seen=seen)
        tally.record(f"{mode} after {after} bytes ({outcome})", found, outcome)
    tally.check()


@pytest.mark.parametrize("mode", ["cut", "stall"])
def test_a_faulted_download_fails_typed_and_leaves_nothing(
        mode: str, proxied: tuple[FaultProxy, registry.Registry]) -> None:
    proxy, reg = proxied
    tally = Tally(f"{mode} S3 connection mid-download")
    v = reg.push(build(7), "net", tags={"seed": "7"})
    seen: dict[str, str] = {}
    for i, after in enumerate(CUT_AFTER if mode == "cut" else STALL_AFTER):
        _cold_cache(reg)
        found, outcome = _attempt(proxy, mode, "down", after,
                                  lambda: reg.pull_state_dict(v.ref, device="cpu"))
        found += after_fault(reg, "net", next_seed=900 + i, seen=seen)
        tally.record(f"{mode} after {after} bytes ({outcome})", found, outcome)
    tally.check()
