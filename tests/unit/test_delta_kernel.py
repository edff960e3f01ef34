"""When the diff's compiled kernel (registry/provenance/kernel.py) loads: only for a diff large
enough to gain from it, once per process, and never at the cost of an answer (numpy instead)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from registry import provenance
from registry.provenance import deltas


@pytest.fixture
def unloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if no diff had loaded the kernel yet."""
    monkeypatch.setattr(deltas._Loaded, "tried", False)
    monkeypatch.setattr(deltas._Loaded, "kernel", None)
    monkeypatch.setattr(deltas._Loaded, "compared", 0)


def test_a_small_diff_never_imports_numba() -> None:
    code = ("import sys, torch\n"
            "from registry.provenance import deltas\n"
            "a = torch.randn(100_000)\n"
            "sums = deltas.compare([(a, a + 1)])[0]\n"
            "assert sums is not None and sums.differ == a.numel(), sums\n"
            "assert 'numba' not in sys.modules, 'a small diff loaded numba'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_large_diff_loads_the_kernel_once_and_later_diffs_keep_it(
        unloaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deltas, "KERNEL_FROM", 1_000)
    assert deltas.fused(10) is None and not deltas._Loaded.tried
    kernel = deltas.fused(1_000)
    assert kernel is not None
    assert deltas.fused(1) is kernel  # loaded: small diffs use it too


def test_small_diffs_load_the_kernel_once_they_have_compared_as_much_by_numpy(
        unloaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deltas, "KERNEL_FROM", 1_000)
    a = torch.randn(300)
    for _ in range(3):  # 900 elements by numpy passes
        assert deltas.compare([(a, a + 1)])[0] is not None
    assert not deltas._Loaded.tried and deltas._Loaded.compared == 900
    assert deltas.fused(99) is None  # 999: not yet
    kernel = deltas.fused(1)  # the thousandth element: this diff loads it
    assert kernel is not None and deltas.fused(1) is kernel


def test_a_kernel_that_cannot_load_leaves_the_numpy_passes(
        unloaded: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(deltas, "KERNEL_FROM", 0)
    monkeypatch.setitem(sys.modules, "registry.provenance.kernel", None)  # import fails
    monkeypatch.delattr(provenance, "kernel", raising=False)
    with caplog.at_level(logging.WARNING, logger=deltas.__name__):
        assert deltas.fused(10**9) is None
    assert "did not load" in caplog.text and "numpy" in caplog.text
    a = torch.randn(5_000)
    b = a.clone()
    b[17] += 2.0
    sums = deltas.compare([(a, b)])[0]
    assert sums is not None and sums.differ == 1 and sums.max_abs == pytest.approx(2.0)
    assert deltas.fused(10**9) is None  # tried once, not again per diff


def test_the_kernel_equals_the_numpy_passes_on_a_fine_tune_sized_change(
        unloaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(5)
    a = torch.randn(3 * deltas.PIECE + 12_345)  # whole pieces and a part one
    b = a + torch.randn(a.numel()) * 1e-3
    b[::11] = a[::11]  # some elements unchanged
    monkeypatch.setattr(deltas, "KERNEL_FROM", 0)
    fast = deltas.compare([(a, b)], workers=2)[0]
    monkeypatch.setattr(deltas, "fused", lambda elements: None)
    slow = deltas.compare([(a, b)], workers=2)[0]
    assert fast is not None and slow is not None
    assert (fast.differ, fast.numel, fast.max_abs) == (slow.differ, slow.numel, slow.max_abs)
    x, y = a.double(), b.double()
    assert fast.delta2 == pytest.approx(float(((y - x) ** 2).sum()), rel=1e-6)
    assert fast.base2 == pytest.approx(float((x * x).sum()), rel=1e-6)
    assert fast.differ == int((a != b).sum())
