"""Device resolution and the dtype table, from faked torch facts (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from registry import DeviceUnavailableError, DtypeError
from registry.model.devices import (
    CudaDevice,
    TorchFacts,
    auto_dtype,
    check_dtype_runs,
    parse_dtype,
    resolve_device,
)
from tests.helpers import fake_devices

GiB = 2**30
CPU_ONLY = TorchFacts(cpu_bytes=16 * GiB)
TWO_GPUS = TorchFacts(cuda=(CudaDevice(0, 2 * GiB, 16 * GiB, (8, 0)),
                            CudaDevice(1, 10 * GiB, 16 * GiB, (7, 5))), cpu_bytes=64 * GiB)
MAC = TorchFacts(mps=True, cpu_bytes=32 * GiB)


def test_probe_reads_what_torch_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_devices(monkeypatch, cuda=[(3 * GiB, (8, 6)), (7 * GiB, (7, 0))], mps=False)
    facts = TorchFacts.probe()
    assert [(d.index, d.free_bytes, d.capability) for d in facts.cuda] == [
        (0, 3 * GiB, (8, 6)), (1, 7 * GiB, (7, 0))]
    assert facts.available() == ["cuda:0", "cuda:1", "cpu"]


def test_probe_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_devices(monkeypatch, cuda=[], mps=True)
    assert TorchFacts.probe().available() == ["mps", "cpu"]


@pytest.mark.parametrize(
    ("facts", "model_bytes", "expected"),
    [
        (CPU_ONLY, 10, "cpu"),
        (MAC, 10, "mps"),
        (TWO_GPUS, 1 * GiB, "cuda:1"),  # the GPU with the most free memory
        (TWO_GPUS, 8 * GiB, "cuda:1"),
        (TWO_GPUS, 12 * GiB, "cpu"),  # fits no GPU: auto may fall back, it was not named
        (TorchFacts(cuda=(CudaDevice(0, 4 * GiB, 8 * GiB, (8, 0)),), mps=True), 5 * GiB, "mps"),
    ],
)
def test_auto_picks_cuda_then_mps_then_cpu(facts: TorchFacts, model_bytes: int,
                                           expected: str) -> None:
    assert str(resolve_device("auto", model_bytes, facts)) == expected


@pytest.mark.parametrize(
    ("request_", "expected"),
    [("cpu", "cpu"), ("cuda", "cuda:0"), ("cuda:1", "cuda:1"), (1, "cuda:1"),
     (torch.device("cuda", 0), "cuda:0"), (torch.device("cpu"), "cpu")],
)
def test_named_devices_are_obeyed(request_: object, expected: str) -> None:
    assert str(resolve_device(request_, 1, TWO_GPUS)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("facts", "request_", "message"),
    [
        (CPU_ONLY, "cuda", "no CUDA device"),
        (CPU_ONLY, "cuda:0", "available: cpu"),
        (CPU_ONLY, 0, "available: cpu"),
        (TWO_GPUS, "cuda:2", "available: cuda:0, cuda:1, cpu"),
        (TWO_GPUS, 5, "has 2 CUDA device"),
        (CPU_ONLY, "mps", "no MPS"),
        (TWO_GPUS, "gpu", "invalid device 'gpu'"),
        (TWO_GPUS, "meta", "not supported"),
        (TWO_GPUS, -1, "invalid device index"),
        (TWO_GPUS, True, "invalid device"),
    ],
)
def test_missing_devices_are_refused_with_what_exists(facts: TorchFacts, request_: object,
                                                      message: str) -> None:
    with pytest.raises(DeviceUnavailableError, match=message):
        resolve_device(request_, 1, facts)  # type: ignore[arg-type]


def test_named_gpu_too_small_is_refused_not_replaced() -> None:
    with pytest.raises(DeviceUnavailableError, match="cuda:0 has 2.00 GiB free.*device_map='auto'"):
        resolve_device("cuda:0", 3 * GiB, TWO_GPUS)


AMPERE = torch.device("cuda", 0)
TURING = torch.device("cuda", 1)


@pytest.mark.parametrize(
    ("stored", "cpu", "ampere", "turing", "mps"),
    [  # the table in shared/DOMAIN.md, row by row; bf16 on the CPU is float32 (issue #30)
        (torch.float32, torch.float32, torch.float32, torch.float32, torch.float32),
        (torch.float16, torch.float32, torch.float16, torch.float16, torch.float16),
        (torch.bfloat16, torch.float32, torch.bfloat16, torch.float32, torch.bfloat16),
        (torch.float64, torch.float64, torch.float64, torch.float64, torch.float32),
        (torch.int64, torch.int64, torch.int64, torch.int64, torch.int64),
        (torch.bool, torch.bool, torch.bool, torch.bool, torch.bool),
    ],
)
def test_auto_dtype_table(stored: torch.dtype, cpu: torch.dtype, ampere: torch.dtype,
                          turing: torch.dtype, mps: torch.dtype) -> None:
    facts = TWO_GPUS
    assert auto_dtype(stored, torch.device("cpu"), facts) == cpu
    assert auto_dtype(stored, AMPERE, facts) == ampere
    assert auto_dtype(stored, TURING, facts) == turing
    assert auto_dtype(stored, torch.device("mps"), MAC) == mps


@pytest.mark.parametrize(
    ("text", "dtype"),
    [("auto", None), ("float32", torch.float32), ("fp16", torch.float16),
     ("torch.bfloat16", torch.bfloat16), ("bf16", torch.bfloat16), ("double", torch.float64),
     (torch.float16, torch.float16)],
)
def test_parse_dtype(text: object, dtype: torch.dtype | None) -> None:
    assert parse_dtype(text) == dtype  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["int8", "floatx", "", torch.int64, 32, None])
def test_parse_dtype_refuses(bad: object) -> None:
    with pytest.raises(DtypeError):
        parse_dtype(bad)  # type: ignore[arg-type]


def test_float64_cannot_be_forced_onto_mps() -> None:
    with pytest.raises(DtypeError, match="float64 is not supported on mps"):
        check_dtype_runs(torch.float64, torch.device("mps"))
    check_dtype_runs(torch.float64, torch.device("cpu"))
