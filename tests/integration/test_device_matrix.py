"""Issue 3's matrix: models as they come out of training, pulled on this (CPU-only) machine.

Tests marked ``gpu`` run the same round trips onto a real CUDA device wherever one exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from registry import DeviceUnavailableError, Registry, UnsafeCheckpointError
from tests.helpers import (
    CUDA_LOAD_ERRORS,
    MLP,
    Encoder,
    TiedLM,
    assert_same_state,
    fake_devices,
    save_as_if_on,
    trained_mlp,
)


def test_gpu_checkpoint_fails_with_torch_and_pulls_with_the_registry(
        reg: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_devices(monkeypatch)  # a machine without a GPU, also where the tests have one
    model = trained_mlp()
    path = save_as_if_on(model.state_dict(), tmp_path / "trained_on_gpu.pth", "cuda:0")
    with pytest.raises(CUDA_LOAD_ERRORS, match="Attempting to deserialize object on a CUDA device"):
        torch.load(path, weights_only=True)

    mv = reg.push(path, "mlp", factory=MLP)
    assert mv.metadata["source"]["devices"] == ["cuda:0"]
    pulled = reg.pull("mlp", device="cpu")
    assert all(t.device.type == "cpu" for t in (*pulled.parameters(), *pulled.buffers()))
    assert_same_state(pulled.state_dict(), model.state_dict())


def test_multi_gpu_checkpoint_records_every_device(reg: Registry, tmp_path: Path) -> None:
    model = trained_mlp()
    sd = model.state_dict()
    first = {k: v for i, (k, v) in enumerate(sd.items()) if i % 2 == 0}
    rest = {k: v for k, v in sd.items() if k not in first}
    a = save_as_if_on(first, tmp_path / "a.pt", "cuda:1")
    b = save_as_if_on(rest, tmp_path / "b.pt", "cuda:0")
    merged = {**torch.load(a, map_location="cpu"), **torch.load(b, map_location="cpu")}
    path = tmp_path / "merged.pt"
    # Re-save with mixed tags, one storage at a time, as a 2-GPU pipeline would write it.
    tags = iter(["cuda:1" if k in first else "cuda:0" for k in merged])
    order = {id(v.untyped_storage()): next(tags) for v in merged.values()}
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda s: order.get(id(s), "cuda:0")  # type: ignore
    try:
        torch.save(merged, path)
    finally:
        torch.serialization.location_tag = original  # type: ignore[assignment]
    mv = reg.push(path, "mlp")
    assert mv.metadata["source"]["devices"] == ["cuda:0", "cuda:1"]


def test_cuda3_checkpoint_pulled_as_cpu(reg: Registry, tmp_path: Path) -> None:
    model = trained_mlp()
    path = save_as_if_on({"state_dict": model.state_dict(), "epoch": 9}, tmp_path / "x.ckpt",
                         "cuda:3")
    reg.push(path, "mlp")
    sd = reg.pull_state_dict("mlp", device="cpu")
    assert_same_state(sd, model.state_dict())
    assert reg.show("mlp").metadata["source"]["devices"] == ["cuda:3"]


def test_named_missing_gpu_is_refused_with_what_exists(reg: Registry, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    fake_devices(monkeypatch)  # no CUDA, also where the tests have a GPU
    reg.push(trained_mlp(), "mlp", factory=MLP)
    with pytest.raises(DeviceUnavailableError, match="no CUDA device here; available: cpu"):
        reg.pull("mlp", device="cuda:0")
    with pytest.raises(DeviceUnavailableError, match="available: cpu"):
        reg.pull_state_dict("mlp", device=1)
    fake_devices(monkeypatch, cuda=[(8 * 2**30, (8, 0)), (8 * 2**30, (8, 0))])
    with pytest.raises(DeviceUnavailableError,
                       match="cuda:5.*2 CUDA device.*cuda:0, cuda:1, cpu"):
        reg.pull("mlp", device="cuda:5")


@pytest.mark.parametrize(
    ("wrap", "wrapping"),
    [
        (lambda m: nn.DataParallel(m), ["DataParallel"]),
        (lambda m: torch.compile(m), ["torch.compile"]),
        (lambda m: torch.compile(nn.DataParallel(m)), ["torch.compile", "DataParallel"]),
        (lambda m: {f"module.{k}": v for k, v in m.state_dict().items()},
         ["DataParallel/DistributedDataParallel"]),
        (lambda m: {f"module._orig_mod.{k}": v for k, v in m.state_dict().items()},
         ["DataParallel/DistributedDataParallel", "torch.compile"]),
    ],
    ids=["DataParallel", "compile", "compile(DataParallel)", "ddp-keys", "ddp+compile-keys"],
)
def test_wrapped_models_round_trip_bit_exact(reg: Registry, wrap, wrapping) -> None:  # type: ignore[no-untyped-def]
    model = trained_mlp()
    mv = reg.push(wrap(model), "mlp", factory=MLP)
    model.cpu()  # where CUDA exists, DataParallel moved it onto cuda:0
    assert mv.metadata["source"]["wrapping"] == wrapping
    pulled = reg.pull(mv.ref, device="cpu")
    assert_same_state(pulled.state_dict(), model.state_dict())
    x = torch.randn(5, 8)
    assert torch.equal(pulled(x), model(x))


def test_fp16_model_auto_pulls_float32_on_cpu_with_exact_values(reg: Registry) -> None:
    model = trained_mlp().half()
    mv = reg.push(nn.DataParallel(model), "mlp", factory=MLP, precision="amp-fp16")
    model.cpu()  # where CUDA exists, DataParallel moved it onto cuda:0
    assert mv.metadata["source"]["precision"] == "amp-fp16"
    assert mv.metadata["source"]["dtypes"] == {"float16": 8, "int64": 1}
    pulled = reg.pull("mlp", device="cpu")
    sd = pulled.state_dict()
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            assert sd[key].dtype == torch.float32
            assert torch.equal(sd[key], value.float())
        else:
            assert sd[key].dtype == torch.int64 and torch.equal(sd[key], value)
    assert pulled(torch.randn(2, 8)).dtype == torch.float32


def test_bf16_auto_pulls_float32_on_cpu_so_a_float32_batch_runs(reg: Registry) -> None:
    model = trained_mlp().to(torch.bfloat16)
    reg.push(model, "mlp", factory=MLP)
    sd = reg.pull_state_dict("mlp", device="cpu")
    assert sd["fc1.weight"].dtype == torch.float32
    assert torch.equal(sd["fc1.weight"], model.fc1.weight.detach().float())
    assert sd["bn.num_batches_tracked"].dtype == torch.int64
    # The article's error ("Input type (float) and bias type (c10::BFloat16) should be the
    # same") cannot happen: the module pulled with dtype="auto" takes the user's float32 batch.
    pulled = reg.pull("mlp", device="cpu")
    assert pulled.fc1.weight.dtype == torch.float32
    assert pulled(torch.randn(2, 8)).dtype == torch.float32


def test_explicit_bf16_is_obeyed_on_cpu(reg: Registry) -> None:
    model = trained_mlp().to(torch.bfloat16)
    reg.push(model, "mlp")
    sd = reg.pull_state_dict("mlp", device="cpu", dtype="bfloat16")
    assert sd["fc1.weight"].dtype == torch.bfloat16
    assert sd["bn.num_batches_tracked"].dtype == torch.int64
    assert_same_state(sd, model.state_dict())


def test_explicit_dtype_casts_floats_only_and_keeps_fp32_modules(reg: Registry) -> None:
    model = trained_mlp()
    reg.push(model, "mlp", keep_in_fp32=["bn"])
    sd = reg.pull_state_dict("mlp", device="cpu", dtype="bfloat16")
    assert sd["fc1.weight"].dtype == torch.bfloat16
    assert torch.equal(sd["fc1.weight"], model.fc1.weight.detach().to(torch.bfloat16))
    assert sd["bn.weight"].dtype == torch.float32  # keep_in_fp32
    assert sd["bn.num_batches_tracked"].dtype == torch.int64  # never cast
    half = reg.pull_state_dict("mlp", device="cpu", dtype=torch.float16)
    assert half["fc2.bias"].dtype == torch.float16 and half["bn.running_var"].dtype == torch.float32


def test_keep_in_fp32_upcasts_half_weights(reg: Registry) -> None:
    reg.push(trained_mlp().half(), "mlp", keep_in_fp32=["bn"])
    sd = reg.pull_state_dict("mlp", device="cpu", dtype="float16")
    assert sd["bn.weight"].dtype == torch.float32
    assert sd["fc1.weight"].dtype == torch.float16
    assert reg.show("mlp").metadata["source"]["keep_in_fp32"] == ["bn"]


def test_tied_embeddings_come_back_tied(reg: Registry) -> None:
    torch.manual_seed(0)
    model = TiedLM().eval()
    mv = reg.push(model, "lm", factory=TiedLM)
    assert mv.metadata["source"]["tied"] == {"lm_head.weight": "embed.weight"}
    pulled = reg.pull("lm", device="cpu")
    assert pulled.lm_head.weight is pulled.embed.weight
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(pulled(ids), model(ids))
    sd = reg.pull_state_dict("lm", device="cpu")
    assert sd["lm_head.weight"] is sd["embed.weight"]


def test_lightning_style_checkpoint(reg: Registry, tmp_path: Path) -> None:
    model = trained_mlp()
    ckpt = {
        "epoch": 3, "global_step": 300, "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.001}]}],
        "lr_schedulers": [],
    }
    path = save_as_if_on(ckpt, tmp_path / "epoch=3-step=300.ckpt", "cuda:0")
    mv = reg.push(path, "lit")
    assert mv.metadata["source"]["checkpoint"]["key"] == "state_dict"
    outer = nn.Module()
    outer.model = MLP()
    pulled = reg.pull("lit", model=outer, device="cpu")
    assert_same_state(pulled.model.state_dict(), model.state_dict())


def test_pickled_whole_model_is_refused(reg: Registry, tmp_path: Path) -> None:
    path = tmp_path / "whole.pth"
    torch.save(trained_mlp(), path)
    with pytest.raises(UnsafeCheckpointError, match=r"tests\.helpers\.MLP.*not executed"):
        reg.push(path, "whole")
    assert reg.list_models() == []


def test_device_map_places_submodules_by_prefix(reg: Registry,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    model = Encoder().eval()
    reg.push(model, "enc", factory=Encoder)
    pulled = reg.pull("enc", device_map={"encoder": "cpu", "decoder.2": "cpu", "": "cpu"})
    x = torch.randn(3, 4)
    assert torch.equal(pulled(x), model(x))
    with pytest.raises(DeviceUnavailableError, match="places no prefix of 'decoder.0.weight'"):
        reg.pull("enc", device_map={"encoder": "cpu"})
    fake_devices(monkeypatch)  # no CUDA, also where the tests have a GPU
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        reg.pull("enc", device_map={"encoder": "cuda:0", "": "cpu"})


def test_device_map_auto_on_cpu_with_max_memory(reg: Registry) -> None:
    model = Encoder().eval()
    reg.push(model, "enc", factory=Encoder)
    pulled = reg.pull("enc", device_map="auto", max_memory={"cpu": "1MiB"})
    x = torch.randn(2, 4)
    assert torch.equal(pulled(x), model(x))
    with pytest.raises(DeviceUnavailableError, match="no device has that much left"):
        reg.pull("enc", device_map="auto", max_memory={"cpu": 64})


def test_pulled_module_is_in_eval_mode_with_everything_on_the_device(reg: Registry) -> None:
    model = trained_mlp()
    model.train()
    reg.push(model, "mlp", factory=MLP)
    pulled = reg.pull("mlp", device="cpu")
    assert not pulled.training and not pulled.bn.training
    assert all(t.device == torch.device("cpu")
               for t in (*pulled.parameters(), *pulled.buffers()))
    assert torch.equal(pulled.scale, torch.full((3,), 2.0)), "non-persistent buffers survive"


# -- real GPU (skipped where none exists) --------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_onto_a_real_gpu(reg: Registry, dtype: torch.dtype) -> None:
    model = trained_mlp().to(dtype)
    mv = reg.push(nn.DataParallel(model), "mlp", factory=MLP)
    # DataParallel moved the module onto its first device; the push recorded where it was.
    assert mv.metadata["source"]["devices"] == ["cuda:0"]
    pulled = reg.pull("mlp", device="cuda")
    capability = torch.cuda.get_device_capability(0)
    expected = torch.float32 if dtype == torch.bfloat16 and capability < (8, 0) else dtype
    assert all(p.device.type == "cuda" for p in pulled.parameters())
    assert pulled.fc1.weight.dtype == expected
    assert pulled.bn.num_batches_tracked.dtype == torch.int64
    assert torch.equal(pulled.fc1.weight.cpu(), model.fc1.weight.detach().cpu().to(expected))


@pytest.mark.gpu
def test_gpu_trained_model_pushes_from_the_gpu(reg: Registry) -> None:
    model = trained_mlp().cuda()
    mv = reg.push(model, "mlp", factory=MLP)
    assert mv.metadata["source"]["devices"] == ["cuda:0"]
    assert_same_state(reg.pull_state_dict("mlp", device="cpu"),
                      {k: v.cpu() for k, v in model.state_dict().items()})
