"""Building modules without weights, and the checks before loading."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from registry import StateDictMismatchError
from registry.materialize import check_fits, empty_parameters
from tests.helpers import MLP


def test_empty_parameters_puts_parameters_on_meta_and_keeps_buffers() -> None:
    with empty_parameters():
        model = MLP()
    assert all(p.is_meta for p in model.parameters())
    assert torch.equal(model.scale, torch.full((3,), 2.0))  # non-persistent buffer kept
    assert not model.bn.running_mean.is_meta
    assert nn.Linear(2, 2).weight.device.type == "cpu", "the patch is gone after the context"


def test_empty_parameters_does_not_touch_other_threads() -> None:
    inside = threading.Event()
    release = threading.Event()
    built: list[nn.Module] = []

    def build_elsewhere() -> None:
        inside.wait()
        built.append(nn.Linear(3, 3))
        release.set()

    worker = threading.Thread(target=build_elsewhere)
    worker.start()
    with empty_parameters():
        inside.set()
        release.wait(timeout=30)
        meta = nn.Linear(3, 3)
    worker.join()
    assert meta.weight.is_meta
    assert built[0].weight.device.type == "cpu" and not built[0].weight.is_meta


def test_nested_contexts() -> None:
    with empty_parameters():
        with empty_parameters():
            a = nn.Linear(1, 1)
        b = nn.Linear(1, 1)
    assert a.weight.is_meta and b.weight.is_meta
    assert not nn.Linear(1, 1).weight.is_meta


def test_check_fits_compares_shapes_from_manifest_specs() -> None:
    model = MLP()
    specs = {k: {"dtype": "float32", "shape": list(v.shape)} for k, v in
             model.state_dict().items()}
    check_fits(model, specs, "m:v1")
    specs["fc2.weight"]["shape"] = [5, 16]
    with pytest.raises(StateDictMismatchError, match=r"fc2.weight stored \(5, 16\) vs model "
                                                    r"\(3, 16\)"):
        check_fits(model, specs, "m:v1")
