"""The diff's tensor comparison (registry/provenance/deltas.py): sums equal to a float64 torch
computation whatever the dtype, chunking or threads; equal bytes unchanged without float math;
NaN, infinities and signed zeros by the documented rule."""

from __future__ import annotations

import math

import pytest
import torch

from registry.provenance import deltas


def _expected(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float, int]:
    x, y = a.to(torch.float32).double(), b.to(torch.float32).double()
    d = y - x
    return (float((d * d).sum()), float((x * x).sum()), float(d.abs().max()),
            int((x != y).sum()))


def _check(sums: deltas.Sums | None, a: torch.Tensor, b: torch.Tensor) -> None:
    assert sums is not None
    delta2, base2, max_abs, differ = _expected(a, b)
    assert sums.delta2 == pytest.approx(delta2, rel=1e-5)
    assert sums.base2 == pytest.approx(base2, rel=1e-5)
    assert sums.max_abs == pytest.approx(max_abs, rel=1e-6)
    assert sums.differ == differ and sums.numel == a.numel()


@pytest.fixture(autouse=True, params=["kernel", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both paths: the compiled one-pass kernel, loaded for any size here (numba
    is a dependency: it must load), and the numpy passes it falls back to."""
    if request.param == "kernel":
        monkeypatch.setattr(deltas, "KERNEL_FROM", 0)
        assert deltas.fused(0) is not None
    else:
        monkeypatch.setattr(deltas, "fused", lambda elements: None)
    return str(request.param)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1,000 elements and pieces of 4,000, so small tensors cross both."""
    monkeypatch.setattr(deltas, "CHUNK", 1000)
    monkeypatch.setattr(deltas, "PIECE", 4000)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_change_in_the_last_element_only_is_found_with_exact_sums(
        small_chunks: None, workers: int) -> None:
    torch.manual_seed(0)
    a = torch.randn(10_001)  # three pieces and a one-element one, chunks ending mid-piece
    b = a.clone()
    b[-1] += 0.5
    sums = deltas.compare([(a, b)], workers=workers)[0]
    _check(sums, a, b)
    assert sums is not None and sums.differ == 1
    assert sums.max_abs == pytest.approx(0.5, rel=1e-6)
    assert sums.base2 == pytest.approx(float((a.double() ** 2).sum()), rel=1e-6)


def test_equal_bytes_are_unchanged_and_cost_no_float_math(
        small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    a = torch.randn(9_000)

    def no_float_math(*_: object) -> deltas.Sums:
        raise AssertionError("an equal tensor was compared in float")

    monkeypatch.setattr(deltas, "piece_sums", no_float_math)
    assert deltas.compare([(a, a.clone()), (a[:0], a[:0].clone())], workers=2) == [None, None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_float_dtypes_compare_widened_to_float32(small_chunks: None,
                                                       dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    a = torch.randn(64, 97).to(dtype)
    b = a.clone()
    b[::3] = (b[::3].float() * 1.5).to(dtype)
    sums = deltas.compare([(a, b)])[0]
    _check(sums, a, b)


def test_a_dtype_cast_is_compared_by_value_and_never_equal_bytes(small_chunks: None) -> None:
    torch.manual_seed(2)
    a = torch.randn(5_000)
    b = a.to(torch.bfloat16)
    sums = deltas.compare([(a, b)])[0]
    _check(sums, a, b)
    exact = torch.tensor([0.5, -2.0, 0.0])
    same_values = deltas.compare([(exact, exact.to(torch.bfloat16))])[0]
    assert same_values is not None and same_values.differ == 0  # the caller reports the dtype


def test_nan_and_infinity_with_equal_bits_are_unchanged(small_chunks: None) -> None:
    a = torch.randn(3_000)
    a[10], a[2000] = math.nan, math.inf
    b = a.clone()
    b[5] += 1.0  # the only change, in the same chunk as the NaN
    sums = deltas.compare([(a, b)])[0]
    assert sums is not None and sums.differ == 1
    assert sums.delta2 == pytest.approx(1.0, rel=1e-6) and sums.max_abs == pytest.approx(1.0)
    assert deltas.compare([(a, a.clone())]) == [None]


def test_a_nan_that_appears_is_a_change_with_nan_norms(small_chunks: None) -> None:
    a = torch.randn(3_000)
    b = a.clone()
    b[2500] = math.nan
    b[7] += 3.0  # a larger change in an earlier chunk: NaN still wins the max
    sums = deltas.compare([(a, b)])[0]
    assert sums is not None and sums.differ == 2
    assert math.isnan(sums.delta2) and math.isnan(sums.max_abs) and math.isnan(sums.relative)
    other_nan = a.clone()
    other_nan[2500] = math.nan
    other_bits = other_nan.clone()
    other_bits.view(torch.int32)[2500] ^= 1  # another NaN payload: the bits changed
    changed = deltas.compare([(other_nan, other_bits)])[0]
    assert changed is not None and changed.differ == 1


def test_signed_zeros_are_equal_values() -> None:
    a = torch.zeros(4)
    b = torch.tensor([0.0, -0.0, 0.0, -0.0])
    sums = deltas.compare([(a, b)])[0]
    assert sums is not None and (sums.differ, sums.delta2, sums.max_abs) == (0, 0.0, 0.0)


def test_a_partly_equal_tensor_keeps_the_norm_of_its_equal_pieces(small_chunks: None) -> None:
    torch.manual_seed(3)
    a = torch.randn(12_000)  # pieces of 4,000: the first two equal, the last changed
    b = a.clone()
    b[11_000:] *= 2
    sums = deltas.compare([(a, b)], workers=2)[0]
    _check(sums, a, b)


def test_from_zero_and_the_norm_alone() -> None:
    torch.manual_seed(4)
    delta = torch.randn(300, 7)
    sums = deltas.compare([(None, delta)])[0]
    assert sums is not None and sums.base2 == 0.0
    assert sums.delta2 == pytest.approx(float((delta.double() ** 2).sum()), rel=1e-6)
    assert sums.max_abs == pytest.approx(float(delta.abs().max()))
    assert sums.differ == delta.numel()
    assert deltas.norm2(delta.to(torch.bfloat16)) == pytest.approx(
        float((delta.to(torch.bfloat16).double() ** 2).sum()), rel=1e-6)


def test_without_libc_memcmp_bytes_are_compared_by_numpy(
        small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deltas, "_MEMCMP", None)
    a = torch.randn(5_000)
    b = a.clone()
    b[4_999] = 7.0
    assert deltas.compare([(a, a.clone())]) == [None]
    _check(deltas.compare([(a, b)])[0], a, b)
    assert deltas.same_bytes(a, b, 0, 4_999) and not deltas.same_bytes(a, b)


def test_non_contiguous_and_integer_tensors(small_chunks: None) -> None:
    a = torch.randn(50, 60).T  # a transposed view
    b = a.clone()
    b[3, 4] += 1
    _check(deltas.compare([(a, b)])[0], a, b)
    counts = torch.arange(2_000)
    _check(deltas.compare([(counts, counts + (counts % 7 == 0))])[0], counts,
           counts + (counts % 7 == 0))


def test_larger_keeps_nan() -> None:
    assert math.isnan(deltas.larger(math.nan, 1.0)) and math.isnan(deltas.larger(1.0, math.nan))
    assert deltas.larger(1.0, 2.0) == 2.0


def test_a_failure_in_any_worker_reaches_the_caller(
        small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = deltas.piece_sums

    def failing(a: torch.Tensor | None, b: torch.Tensor, start: int, stop: int,
                scratch: deltas.Scratch | None = None) -> deltas.Sums:
        if start == 8_000:  # the third piece: whichever thread takes it
            raise MemoryError("no buffer")
        return real(a, b, start, stop, scratch)

    monkeypatch.setattr(deltas, "piece_sums", failing)
    a = torch.randn(20_000)
    with pytest.raises(MemoryError, match="no buffer"):
        deltas.compare([(a, a + 1)], workers=3)
