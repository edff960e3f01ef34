"""The seed's failures, closed (issue #30): wrapper prefixes in any chain and order are stripped
from files as from objects, and a pull whose keys do not fit names the prefix that explains it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from registry import NormalizationError, Registry, StateDictMismatchError
from tests.helpers import MLP, assert_same_state, trained_mlp


def test_a_compiled_ddp_checkpoint_pushed_from_a_file_pulls_plain(reg: Registry,
                                                                  tmp_path: Path) -> None:
    model = trained_mlp()
    # PyTorch's recommended order: wrap for data parallelism, then compile.
    wrapped = torch.compile(nn.DataParallel(model))
    state = wrapped.state_dict()
    assert next(iter(state)).startswith("_orig_mod.module.")
    path = tmp_path / "compiled_ddp.pt"
    torch.save(state, path)

    mv = reg.push(path, "mlp", factory=MLP)
    model.cpu()  # where CUDA exists, DataParallel moved it onto cuda:0
    assert set(mv.metadata["tensors"]) == set(model.state_dict())
    assert mv.metadata["source"]["wrapping"] == ["torch.compile",
                                                 "DataParallel/DistributedDataParallel"]
    pulled = reg.pull("mlp", device="cpu")
    assert_same_state(pulled.state_dict(), model.state_dict())


def test_a_key_still_naming_a_wrapper_is_never_stored(reg: Registry, tmp_path: Path) -> None:
    path = tmp_path / "fsdp_local.pt"
    torch.save({"_fsdp_wrapped_module._flat_param": torch.ones(10)}, path)
    with pytest.raises(NormalizationError, match="'_fsdp_wrapped_module._flat_param' still"):
        reg.push(path, "fsdp")
    assert reg.list_models() == []


def test_a_pull_whose_keys_miss_a_prefix_names_it(reg: Registry) -> None:
    holder = nn.Module()
    holder.module = trained_mlp()  # a real submodule called "module": its keys are kept
    reg.push(holder, "held")
    with pytest.raises(StateDictMismatchError) as info:
        reg.pull("held", device="cpu", model=MLP())
    message = str(info.value)
    assert "the stored keys carry the prefix 'module.'" in message
    assert "architecture or configuration differs" not in message
