"""Which devices run each quantization scheme: pure facts, tested without a GPU."""

from __future__ import annotations

import pytest
import torch

from registry.formats.base import Runs
from registry.formats.table import METHODS, check
from registry.model.devices import CudaDevice, TorchFacts

A100 = TorchFacts(cuda=(CudaDevice(0, 2**34, 2**35, (8, 0)),))
H100 = TorchFacts(cuda=(CudaDevice(0, 2**34, 2**35, (9, 0)),))
T4 = TorchFacts(cuda=(CudaDevice(0, 2**34, 2**35, (7, 5)),))


@pytest.mark.parametrize(("method", "device", "facts", "runs"), [
    ("int8_weight_only", "cpu", TorchFacts(), True),
    ("int8_weight_only", "cuda:0", T4, True),
    ("float8_weight_only", "cuda:0", A100, False),
    ("float8_weight_only", "cuda:0", H100, True),
    ("float8_weight_only", "cpu", TorchFacts(), True),
    ("int4_weight_only", "cpu", TorchFacts(), False),
    ("int4_weight_only", "cuda:0", T4, False),
    ("int4_weight_only", "cuda:0", A100, True),
    ("int4_weight_only", "cuda:1", A100, False),  # no such GPU
    ("int8_weight_only", "mps", TorchFacts(mps=True), False),
    ("intx_weight_only", "cpu", TorchFacts(), True),
    ("intx_weight_only", "cuda:0", T4, True),
    ("int8_dynamic_activation_intx_weight", "cpu", TorchFacts(), True),
])
def test_torchao_methods_run_where_their_kernels_exist(method: str, device: str,
                                                      facts: TorchFacts, runs: bool) -> None:
    assert METHODS[("torchao", method)].on(torch.device(device), facts) is runs


def test_dynamic_qint8_runs_on_the_cpu_alone() -> None:
    runs = METHODS[("torch.ao", "dynamic_qint8")]
    assert runs.on(torch.device("cpu"), TorchFacts())
    assert not runs.on(torch.device("cuda:0"), H100)
    assert runs.labels() == ["cpu"]


def test_labels_name_the_capability() -> None:
    assert Runs(cpu=False, cuda=(8, 9)).labels() == ["cuda (capability >= 8.9)"]
    assert Runs(cpu=True, cuda=(0, 0), mps=True).labels() == ["cpu", "cuda", "mps"]


def test_a_record_of_an_unknown_scheme_is_named() -> None:
    assert "not a scheme this registry loads" in str(check({"library": "bitsandbytes",
                                                           "method": "nf4"}))
    assert "not an object" in str(check(["torchao"]))
