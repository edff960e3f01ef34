"""Push-side normalization: unwrapping, prefix stripping, ties, refusals, source facts."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from registry import CheckpointError, NormalizationError, UnsafeCheckpointError
from registry.formats.floats import unwrap
from registry.formats.table import flatten
from registry.model.factories import factory_string
from tests.helpers import CUDA_LOAD_ERRORS, MLP, TiedLM, save_as_if_on, trained_mlp


def test_module_input_records_class_params_and_facts() -> None:
    model = trained_mlp()
    w = flatten(model)
    assert w.architecture["class"] == "tests.helpers:MLP"
    assert set(w.tensors) == set(model.state_dict())
    assert w.source["params"] == sum(p.numel() for p in model.parameters())
    assert w.source["devices"] == ["cpu"]
    assert w.source["dtypes"] == {"float32": 8, "int64": 1}
    assert w.source["wrapping"] == []
    assert w.source["precision"] == "float32"
    assert w.source["size_bytes"] == sum(t.numel() * t.element_size() for t in w.tensors.values())
    assert w.source["torch_version"] == torch.__version__


@pytest.mark.parametrize(
    ("wrap", "expected"),
    [
        (lambda m: nn.DataParallel(m), ["DataParallel"]),
        (lambda m: torch.compile(m), ["torch.compile"]),
        (lambda m: torch.compile(nn.DataParallel(m)), ["torch.compile", "DataParallel"]),
        (lambda m: nn.DataParallel(nn.DataParallel(m)), ["DataParallel", "DataParallel"]),
    ],
)
def test_wrapper_objects_are_unwrapped(wrap, expected: list[str]) -> None:  # type: ignore[no-untyped-def]
    model = trained_mlp()
    w = flatten(wrap(model))
    assert w.source["wrapping"] == expected
    assert sorted(w.tensors) == sorted(model.state_dict())
    # Where CUDA exists, DataParallel moves the module onto cuda:0; normalized tensors are CPU.
    for key, value in model.state_dict().items():
        assert w.tensors[key].device.type == "cpu"
        assert torch.equal(w.tensors[key], value.cpu())


def test_parameter_count_agrees_across_input_kinds(tmp_path: Path) -> None:
    model = trained_mlp()
    path = tmp_path / "w.pt"
    torch.save(model.state_dict(), path)
    counts = {flatten(x).source["params"] for x in (model, model.state_dict(), path)}
    assert counts == {sum(p.numel() for p in model.parameters())}


def test_prefixed_state_dict_keys_are_stripped_and_wrapping_inferred() -> None:
    sd = trained_mlp().state_dict()
    prefixed = {f"module._orig_mod._fsdp_wrapped_module.{k}": v for k, v in sd.items()}
    w = flatten(prefixed)
    assert sorted(w.tensors) == sorted(sd)
    assert w.source["wrapping"] == ["DataParallel/DistributedDataParallel", "torch.compile",
                                    "FullyShardedDataParallel"]


def test_repeated_module_prefix_and_inner_checkpoint_wrappers() -> None:
    sd = {"module.module.layers.0._checkpoint_wrapped_module.weight": torch.ones(2),
          "module.module.layers.1._checkpoint_wrapped_module.weight": torch.zeros(2)}
    w = flatten(sd)
    assert sorted(w.tensors) == ["layers.0.weight", "layers.1.weight"]
    assert w.source["wrapping"] == ["DataParallel/DistributedDataParallel", "CheckpointWrapper"]


def test_a_submodule_named_module_is_not_mistaken_for_a_wrapper() -> None:
    sd = {"module.weight": torch.ones(1), "head.weight": torch.ones(1)}
    assert sorted(flatten(sd).tensors) == ["head.weight", "module.weight"]


def test_a_module_whose_only_child_is_called_module_keeps_its_keys() -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    assert sorted(flatten(Holder()).tensors) == ["module.bias", "module.weight"]
    assert sorted(flatten(nn.DataParallel(Holder())).tensors) == ["module.bias", "module.weight"]


def test_nested_data_parallel_inside_a_model() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    model.add_module("inner", nn.DataParallel(nn.Linear(2, 2)))
    w = flatten(model)
    assert sorted(w.tensors) == ["0.bias", "0.weight", "inner.bias", "inner.weight"]


@pytest.mark.parametrize(
    ("wrap", "wrapping"),
    [  # issue #30: PyTorch's recommended order compiles the DDP-wrapped model
        (lambda m: torch.compile(nn.DataParallel(m)),
         ["torch.compile", "DataParallel/DistributedDataParallel"]),
        (lambda m: nn.DataParallel(torch.compile(nn.DataParallel(m))),
         ["DataParallel/DistributedDataParallel", "torch.compile"]),  # each wrapper named once
        (lambda m: torch.compile(nn.DataParallel(torch.compile(nn.DataParallel(m)))),
         ["torch.compile", "DataParallel/DistributedDataParallel"]),
    ],
)
def test_wrapper_prefixes_in_any_order_are_stripped_from_files(tmp_path: Path, wrap,  # type: ignore[no-untyped-def]
                                                               wrapping: list[str]) -> None:
    model = trained_mlp()
    wrapped = wrap(model).state_dict()
    assert next(iter(wrapped)).split(".")[0] in ("_orig_mod", "module")
    path = tmp_path / "ckpt.pt"
    torch.save(wrapped, path)
    for given in (wrapped, path):
        w = flatten(given)
        assert list(w.tensors) == list(model.state_dict())
        assert w.key_order == list(model.state_dict())
        assert w.module_metadata == _versions(model)
        assert w.source["wrapping"] == wrapping


def test_compiled_ddp_keys_become_the_plain_keys() -> None:
    sd = {"_orig_mod.module.conv1.weight": torch.ones(1),
          "_orig_mod.module._fsdp_wrapped_module.fc._checkpoint_wrapped_module.bias": torch.ones(1)}
    assert list(flatten(sd).tensors) == ["conv1.weight", "fc.bias"]


@pytest.mark.parametrize("key", ["_fsdp_wrapped_module._flat_param",
                                 "module.layer._orig_mod", "encoder._fsdp_flat_param"])
def test_a_key_still_naming_a_wrapper_is_refused(key: str) -> None:
    with pytest.raises(NormalizationError, match=f"key {key!r} still carries the wrapper part"):
        flatten({key: torch.ones(2), "head.weight": torch.ones(1)})


def test_keys_colliding_after_stripping_name_both() -> None:
    sd = {"_orig_mod.fc.weight": torch.ones(1), "fc.weight": torch.zeros(1)}
    with pytest.raises(NormalizationError, match="'_orig_mod.fc.weight' and 'fc.weight'"):
        flatten(sd)


def test_tied_weights_stored_once_with_alias() -> None:
    model = TiedLM()
    w = flatten(model)
    assert w.tied == {"lm_head.weight": "embed.weight"}
    assert "lm_head.weight" not in w.tensors
    assert w.source["tied"] == {"lm_head.weight": "embed.weight"}


def test_overlapping_views_get_their_own_bytes() -> None:
    base = torch.arange(8.0)
    w = flatten({"a": base[:4], "b": base[4:], "c": base[:4]})
    assert w.tied == {"c": "a"}
    assert torch.equal(w.tensors["a"], torch.arange(4.0))
    assert torch.equal(w.tensors["b"], torch.arange(4.0, 8.0))
    ptrs = {t.untyped_storage().data_ptr() for t in w.tensors.values()}
    assert len(ptrs) == 2


def test_tensors_are_detached_contiguous_cpu() -> None:
    t = torch.randn(3, 4, requires_grad=True)
    w = flatten({"t": t.t()})
    out = w.tensors["t"]
    assert out.is_contiguous() and not out.requires_grad and out.device.type == "cpu"
    assert torch.equal(out, t.detach().t())


def test_json_extras_are_kept() -> None:
    w = flatten({"w": torch.ones(1), "epoch": 3, "config": {"lr": 0.1, "layers": [1, 2]}})
    assert w.extras == {"epoch": 3, "config": {"lr": 0.1, "layers": [1, 2]}}
    assert list(w.tensors) == ["w"]


def _quantized() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated, but users have them
        return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (torch.ones(2, 2).to_sparse(), "sparse"),
        (_quantized(), "quantized"),
        (torch.empty(2, device="meta"), "meta device"),
        (object(), "neither a tensor nor JSON"),
        ({"inner": torch.ones(1)}, "holds tensors"),
        (float("nan"), "neither a tensor nor JSON"),
    ],
)
def test_unstorable_entries_are_refused_by_key(value: object, message: str) -> None:
    with pytest.raises(NormalizationError, match=message) as info:
        flatten({"good": torch.ones(1), "bad.key": value})
    assert "'bad.key'" in str(info.value)


def test_precision_declared_or_inferred() -> None:
    half = {"a": torch.ones(2, dtype=torch.float16), "n": torch.tensor(3)}
    assert flatten(half).source["precision"] == "float16"
    mixed = {"a": torch.ones(2, dtype=torch.float16), "b": torch.ones(2)}
    assert flatten(mixed).source["precision"] == "mixed"
    assert flatten(mixed, precision="amp-fp16").source["precision"] == "amp-fp16"
    assert flatten({"b": torch.ones(1, dtype=torch.bfloat16)}).source["precision"] == "bfloat16"


def test_cuda_tagged_pickle_records_devices_without_a_gpu(tmp_path: Path) -> None:
    path = save_as_if_on(trained_mlp().state_dict(), tmp_path / "gpu.pt", "cuda:3")
    # Without CUDA: "on a CUDA device"; with fewer than 4 GPUs: "on CUDA device 3 but ...".
    with pytest.raises(CUDA_LOAD_ERRORS, match="deserialize object on (a )?CUDA device"):
        torch.load(path, weights_only=True)
    w = flatten(path)
    assert w.source["devices"] == ["cuda:3"]
    assert w.source["checkpoint"] == {"file": "gpu.pt", "format": "torch-pickle"}
    assert all(t.device.type == "cpu" for t in w.tensors.values())


@pytest.mark.parametrize("key", ["state_dict", "model_state_dict", "model", "module"])
def test_nested_training_checkpoints(tmp_path: Path, key: str) -> None:
    sd = trained_mlp().state_dict()
    ckpt = {"epoch": 7, key: sd, "optimizer_states": [{"lr": 0.1}]}
    path = save_as_if_on(ckpt, tmp_path / "last.ckpt", "cuda:0")
    w = flatten(path)
    assert sorted(w.tensors) == sorted(sd)
    assert w.source["checkpoint"]["key"] == key
    assert w.source["devices"] == ["cuda:0"]


def test_whole_model_pickle_is_refused_unexecuted(tmp_path: Path) -> None:
    path = tmp_path / "model.pth"
    torch.save(MLP(), path)
    with pytest.raises(UnsafeCheckpointError, match="was not executed") as info:
        flatten(path)
    assert "state_dict" in str(info.value)
    assert isinstance(info.value, CheckpointError)


def test_unreadable_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        flatten(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable torch checkpoint"):
        flatten(junk)
    weird = tmp_path / "weights.xyz"
    weird.write_bytes(b"hello")
    with pytest.raises(CheckpointError, match="cannot tell what"):
        flatten(weird)
    tensor_only = tmp_path / "t.pt"
    torch.save(torch.ones(2), tensor_only)
    with pytest.raises(CheckpointError, match="single tensor"):
        flatten(tensor_only)
    no_weights = tmp_path / "n.pt"
    torch.save({"epoch": 1, "config": {"a": 1}}, no_weights)
    with pytest.raises(CheckpointError, match="found no weights.*'epoch'"):
        flatten(no_weights)


def test_safetensors_file_input(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in trained_mlp().state_dict().items()}
    save_file(sd, tmp_path / "w.safetensors")
    w = flatten(tmp_path / "w.safetensors")
    assert w.source["checkpoint"]["format"] == "safetensors"
    assert w.source["devices"] == []
    for k, v in sd.items():
        assert torch.equal(w.tensors[k], v)


def test_refuses_other_inputs() -> None:
    with pytest.raises(NormalizationError, match="cannot push a int"):
        flatten(42)  # type: ignore[arg-type]


def test_unwrap_returns_inner_module() -> None:
    inner = MLP()
    assert unwrap(nn.DataParallel(inner)) == (inner, ["DataParallel"])


def test_factory_string() -> None:
    assert factory_string("torchvision.models:resnet18") == "torchvision.models:resnet18"
    assert factory_string(MLP) == "tests.helpers:MLP"
    for bad in ("resnet18", "a:b:c", "mod:"):
        with pytest.raises(NormalizationError, match="invalid factory"):
            factory_string(bad)
    with pytest.raises(NormalizationError, match="importable by name"):
        factory_string(lambda: MLP())


# -- module metadata and key order (issue 18) -------------------------------------------------

def _versions(model: nn.Module) -> dict[str, dict[str, int]]:
    return {p: {"version": e["version"]} for p, e in model.state_dict()._metadata.items()}  # type: ignore[attr-defined]


def test_module_input_keeps_each_modules_version_and_the_key_order() -> None:
    model = trained_mlp()
    w = flatten(model)
    assert w.module_metadata == _versions(model)
    assert w.module_metadata["bn"] == {"version": 2}  # BatchNorm's, read by its loader
    assert w.key_order == list(model.state_dict())
    assert w.key_order != sorted(w.key_order)


@pytest.mark.parametrize("wrap", [
    lambda m: nn.DataParallel(m),
    lambda m: nn.DataParallel(nn.DataParallel(m)),
    lambda m: torch.compile(m),
])
def test_wrapper_metadata_gives_way_to_the_inner_modules(wrap) -> None:  # type: ignore[no-untyped-def]
    model = trained_mlp()
    wrapped = wrap(model)
    expected = _versions(model)
    assert flatten(wrapped).module_metadata == expected
    # The same wrapper seen only through its state dict's keys and _metadata prefixes.
    assert flatten(wrapped.state_dict()).module_metadata == expected
    assert flatten(wrapped.state_dict()).key_order == list(model.state_dict())


def test_data_parallel_nested_inside_a_model_is_renamed_in_metadata() -> None:
    outer = nn.Sequential(nn.DataParallel(nn.BatchNorm1d(3)), nn.Linear(3, 2))
    w = flatten(outer)
    assert w.module_metadata["0"] == {"version": 2}  # the BatchNorm's, not DataParallel's
    assert "0.module" not in w.module_metadata
    assert set(w.tensors) == set(nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2)).state_dict())


@pytest.mark.parametrize("nest", [None, "state_dict"])
def test_checkpoint_input_keeps_the_metadata_torch_save_wrote(tmp_path: Path,
                                                              nest: str | None) -> None:
    model = trained_mlp()
    path = tmp_path / "model.pth"
    state = model.state_dict()
    torch.save({nest: state, "epoch": 3} if nest else state, path)
    w = flatten(path)
    assert w.module_metadata == _versions(model)
    assert w.key_order == list(state)


def test_a_plain_dict_has_no_metadata_and_junk_metadata_is_dropped() -> None:
    state = trained_mlp().state_dict()
    assert flatten(dict(state)).module_metadata == {}
    state._metadata = {"": {"version": "1"}, "bn": {"version": 2, "x": object()},  # type: ignore[attr-defined]
                       "fc1": None, 3: {"version": 1}, "fc2": {"version": True}}
    assert flatten(state).module_metadata == {"bn": {"version": 2}}
