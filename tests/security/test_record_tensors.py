"""Records checked against their tensors before anything is built (issue 45): a torch.ao record
naming a module its weights lack, and shard headers whose shapes multiply past 64 bits (a zero
dimension included), are typed errors, not KeyError or torch's "Stride calculation overflowed"."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from registry import QuantizationError, Registry
from registry.errors import ManifestError
from registry.io.weights import load_shard
from tests.security.test_quantized_records import _dynamic, _float, _tamper
from tests.security.test_strict_reads import _shard

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_a_torch_ao_record_naming_a_module_the_weights_lack(reg: Registry,
                                                           dtype: str) -> None:
    manifest = _dynamic(reg)
    extra: dict[str, Any] = {**manifest["quantization"]["modules"][0], "path": "9"}
    manifest["quantization"]["modules"].append(extra)
    _tamper(reg, manifest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(QuantizationError, match="'9'.*not stored"):
            reg.pull("q:v1", device="cpu", model=_float, dtype=dtype)
        with pytest.raises(QuantizationError, match="'9'.*not stored"):
            reg.pull_state_dict("q:v1", device="cpu", dtype="float32")


@pytest.mark.parametrize("shape", [
    [0, 2**62, 2**62],  # no bytes, yet torch cannot compute its strides
    [2**32, 2**32, 0, 2**8],
    [1] * 65,  # more dimensions than torch allows
], ids=["zero-then-overflow", "overflow-around-a-zero", "65-dims"])
def test_shapes_whose_products_overflow_are_refused_by_the_header_reader(
        work: Path, shape: list[int]) -> None:
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0 if 0 in shape else 4]}}
    path = _shard(work / "shard", json.dumps(header).encode(), b"" if 0 in shape else b"\0" * 4)
    with pytest.raises(ManifestError, match="not a valid safetensors file"):
        load_shard(path, {"w": {"dtype": "float32", "shape": shape}},
                   lambda _k: torch.device("cpu"), lambda _k, d, _v: d, origin="m:v1")
