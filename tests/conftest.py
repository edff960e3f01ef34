"""Fixtures shared by the whole suite. Every test gets its own REGISTRY_HOME."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import registry
from registry.formats.peft import replay as peftreplay

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_service(what: str, reason: str) -> None:
    """Skip locally when a service is missing; fail under CI=true, where it must exist."""
    if IN_CI:
        pytest.fail(f"{what} is required in CI but unavailable: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in list(os.environ):
        if key.startswith("REGISTRY_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("REGISTRY_HOME", str(tmp_path / "home"))
    # gc in a test frees what the test just deleted; tests of the grace itself (tests/faults,
    # test_gc_race.py) set REGISTRY_GC_GRACE or pass grace= themselves.
    monkeypatch.setenv("REGISTRY_GC_GRACE", "0")
    # ...and purges what a test deleted at once (the trash's window has its own tests, which
    # set REGISTRY_TRASH_DAYS themselves: tests/integration/test_governance.py).
    monkeypatch.setenv("REGISTRY_TRASH_DAYS", "0")
    # Each test pulls adapters as a new process would: PEFT's own attach first, no recipe from
    # an earlier test's pulls of a base with the same digest (registry/formats/peft/replay.py).
    peftreplay.forget()
    yield


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def reg(home: Path) -> Iterator[registry.Registry]:
    r = registry.Registry(home=home)
    yield r
    r.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
