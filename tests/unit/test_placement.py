"""Placement: device maps planned from faked torch facts, tied groups and blocks kept whole, the
first GPU's reserve, and the hooks that let a pulled module run (no GPU needed except where
marked ``gpu``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from registry import DeviceUnavailableError, Registry, SettingsError
from registry.formats.table import flatten
from registry.model.devices import CudaDevice, TorchFacts
from registry.model.placement import (
    Placement,
    Unit,
    assign,
    convert,
    install_hooks,
    longest_prefix,
    parse_memory,
    plan,
    plan_units,
    tensor_bytes,
)
from tests.helpers import MLP, TiedLM, fake_devices, trained_mlp

GiB = 2**30

# -- the pure planner ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("10GiB", 10 * GiB), ("512MB", 512 * 10**6), ("1.5 GiB", int(1.5 * GiB)), (123, 123),
     ("7", 7), ("2kib", 2048)],
)
def test_parse_memory(value: object, expected: int) -> None:
    assert parse_memory(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["ten", "-1GiB", -5, "1PB"])
def test_parse_memory_refuses(bad: object) -> None:
    with pytest.raises(DeviceUnavailableError, match="max_memory"):
        parse_memory(bad)  # type: ignore[arg-type]


def _units(*pairs: tuple[str, int]) -> list[Unit]:
    return [Unit((name,), size) for name, size in pairs]


def test_assign_fills_gpus_in_order_then_spills_to_cpu_keeping_a_reserve_on_the_first() -> None:
    units = _units(("embed", 40), ("layers.0", 30), ("layers.1", 30), ("layers.2", 30),
                   ("head", 20))
    # cuda:0 keeps 40 (the largest unit) of its 115 free: embed and layers.0 fit, layers.1 not.
    plan_ = assign(units, {"cuda:0": 115, "cuda:1": 65, "cpu": 1000})
    assert plan_ == {"embed": "cuda:0", "layers.0": "cuda:0", "layers.1": "cuda:1",
                     "layers.2": "cuda:1", "head": "cpu"}


def test_assign_reserves_only_on_the_first_gpu() -> None:
    # cuda:0 keeps 50 of 110; cuda:1 keeps nothing back, so b and c both fit its 100.
    plan_ = assign(_units(("a", 50), ("b", 50), ("c", 50)),
                   {"cuda:0": 110, "cuda:1": 100, "cpu": 1000})
    assert plan_ == {"a": "cuda:0", "b": "cuda:1", "c": "cuda:1"}


def test_assign_never_splits_a_unit_and_never_goes_back() -> None:
    plan_ = assign([Unit(("a", "a2"), 90), Unit(("b",), 20), Unit(("c",), 5)],
                   {"cuda:0": 195, "cpu": 100})
    # cuda:0 keeps 90 for activations: a (and its partner a2) fit in the 105 left, b (20) does not,
    # and the small c after it does not return there either, so placement stays in model order.
    assert plan_ == {"a": "cuda:0", "a2": "cuda:0", "b": "cpu", "c": "cpu"}


def test_assign_refuses_a_unit_that_fits_nowhere_and_names_the_reserve() -> None:
    with pytest.raises(DeviceUnavailableError, match="'big' needs.*cuda:0 keeps"):
        assign(_units(("big", 500)), {"cuda:0": 600, "cpu": 200})
    with pytest.raises(DeviceUnavailableError, match="'big' needs"):
        assign(_units(("big", 500)), {"cpu": 200})


def test_longest_prefix_matches_whole_module_names() -> None:
    table = {"": 0, "encoder": 1, "encoder.layers.1": 2}
    assert longest_prefix("encoder.layers.1.weight", table) == "encoder.layers.1"
    assert longest_prefix("encoder.layers.10.weight", table) == "encoder"
    assert longest_prefix("encoderx.weight", table) == ""
    assert longest_prefix("decoder.weight", {"encoder": 1}) is None


def test_units_merge_a_tied_alias_with_the_tensor_it_shares() -> None:
    model = TiedLM(vocab=16, dim=4)
    sizes = {"embed.weight": 256, "body.weight": 64, "body.bias": 16}
    units = plan_units(model, sizes, tied={"lm_head.weight": "embed.weight"})
    assert units == [Unit(("embed", "lm_head"), 256), Unit(("body",), 80)]


# -- real architectures from transformers configs (no downloads) --------------------------------

def _gpt2() -> nn.Module:
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(n_layer=4, n_embd=64, n_head=2, vocab_size=512, n_positions=64)
    return tf.GPT2LMHeadModel(cfg).eval()


def _t5() -> nn.Module:
    tf = pytest.importorskip("transformers")
    cfg = tf.T5Config(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=3,
                      num_decoder_layers=3, num_heads=2, tie_word_embeddings=True)
    return tf.T5ForConditionalGeneration(cfg).eval()


def _llama() -> nn.Module:
    tf = pytest.importorskip("transformers")
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, tie_word_embeddings=False)
    return tf.LlamaForCausalLM(cfg).eval()


def _manifest(model: nn.Module) -> dict[str, Any]:
    weights = flatten(model)
    return {"tensors": {k: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                        for k, t in weights.tensors.items()},
            "source": weights.source}


def _facts(gpu0: int, gpu1: int, cpu: int) -> TorchFacts:
    # default_max_memory plans 90% of what a GPU reports free.
    return TorchFacts(cuda=(CudaDevice(0, int(gpu0 / 0.9) + 1, 80 * GiB, (8, 0)),
                            CudaDevice(1, int(gpu1 / 0.9) + 1, 80 * GiB, (8, 0))),
                      cpu_bytes=cpu)


def _bytes_on(placement: Placement, manifest: dict[str, Any], device: str) -> int:
    return sum(tensor_bytes(spec) for key, spec in manifest["tensors"].items()
               if str(placement.device_of(key)) == device)


@pytest.mark.parametrize(("build", "tied_count"), [(_gpt2, 1), (_t5, 3), (_llama, 0)],
                         ids=["gpt2", "t5", "llama"])
def test_auto_plan_keeps_tied_groups_and_blocks_whole_across_two_gpus_and_cpu(
        build: Callable[[], nn.Module], tied_count: int) -> None:
    model = build()
    manifest = _manifest(model)
    tied = manifest["source"].get("tied", {})
    assert len(tied) == tied_count
    total = int(manifest["source"]["size_bytes"])
    blocks = getattr(model, "_no_split_modules", None)
    assert blocks, "transformers declares the blocks it never splits"
    units = plan_units(model, {k: tensor_bytes(v) for k, v in manifest["tensors"].items()},
                       no_split=blocks, tied=tied)
    largest = max(u.size for u in units)
    facts = _facts(largest + total // 3, total // 3, 64 * GiB)

    placement = plan(model, manifest, device_map="auto", facts=facts)

    assert {str(d) for d in placement.devices} == {"cuda:0", "cuda:1", "cpu"}
    for alias, kept in tied.items():
        assert placement.device_of(alias) == placement.device_of(kept), alias
        owner = alias.rpartition(".")[0]
        assert placement.modules[owner] == placement.device_of(kept)
    keys = [k for k, _ in (*model.named_parameters(remove_duplicate=False),
                           *model.named_buffers(remove_duplicate=False))]
    seen_blocks = 0
    for name, sub in model.named_modules():
        if type(sub).__name__ in blocks:
            seen_blocks += 1
            inside = {placement.device_of(k) for k in keys if k.startswith(name + ".")}
            assert len(inside) == 1, f"{name} is split across {inside}"
    assert seen_blocks >= 3
    budget0 = int(facts.cuda[0].free_bytes * 0.9)
    assert _bytes_on(placement, manifest, "cuda:0") <= budget0 - largest


def test_gpt2_with_room_for_the_embedding_keeps_lm_head_with_it() -> None:
    """The issue's case: one GPU with room for the embedding and a little more, spill to CPU."""
    model = _gpt2()
    manifest = _manifest(model)
    assert manifest["source"]["tied"] == {"lm_head.weight": "transformer.wte.weight"}
    wte = model.transformer.wte.weight.numel() * 4
    facts = TorchFacts(cuda=(CudaDevice(0, int(3 * wte / 0.9) + 1, 80 * GiB, (8, 0)),),
                       cpu_bytes=64 * GiB)
    placement = plan(model, manifest, device_map="auto", facts=facts)
    assert str(placement.modules["transformer.wte"]) == "cuda:0"
    assert str(placement.modules["lm_head"]) == "cuda:0"
    assert str(placement.modules["transformer.ln_f"]) == "cpu"
    # Every module of a block follows the block; none is planned on its own.
    assert "transformer.h.0.attn.c_attn" not in placement.modules
    assert len({placement.modules[f"transformer.h.{i}"] for i in range(4)}) <= 2


def test_no_split_can_be_turned_off_and_is_checked() -> None:
    model = _gpt2()
    manifest = _manifest(model)
    facts = _facts(10 * GiB, 10 * GiB, 64 * GiB)
    leafwise = plan(model, manifest, device_map="auto", no_split=[], facts=facts)
    assert "transformer.h.0.attn.c_attn" in leafwise.modules
    with pytest.raises(SettingsError, match="no_split names 'GPT2Blok'.*GPT2Block"):
        plan(model, manifest, device_map="auto", no_split=["GPT2Blok"], facts=facts)
    with pytest.raises(SettingsError, match="no_split only applies with device_map='auto'"):
        plan(model, manifest, device="cpu", no_split=["GPT2Block"], facts=facts)


def test_explicit_map_that_separates_a_tied_alias_from_its_weight_is_refused() -> None:
    model = _gpt2()
    manifest = _manifest(model)
    facts = _facts(10 * GiB, 10 * GiB, 64 * GiB)
    with pytest.raises(SettingsError, match=r"'lm_head' on cpu.*tied to 'transformer\.wte\.weight'"
                                            r" on cuda:0.*map 'lm_head' to cuda:0"):
        plan(model, manifest, device_map={"transformer": "cuda:0", "": "cpu"}, facts=facts)
    ok = plan(model, manifest, device_map={"transformer": "cuda:0", "lm_head": "cuda:0"},
              facts=facts)
    assert ok.devices == [torch.device("cuda", 0)]
    with pytest.raises(SettingsError, match="'transformer.nope' names no submodule"):
        plan(model, manifest, device_map={"transformer.nope": "cpu", "": "cpu"}, facts=facts)


def test_faked_gpus_through_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _llama()
    manifest = _manifest(model)
    total = int(manifest["source"]["size_bytes"])
    fake_devices(monkeypatch, cuda=[(total // 2, (8, 0)), (total // 2, (8, 0))])
    placement = plan(model, manifest, device_map="auto", facts=TorchFacts.probe())
    layers = [placement.modules[f"model.layers.{i}"] for i in range(4)]
    assert layers == sorted(layers, key=lambda d: (d.type != "cuda", d.index or 0))
    assert placement.device_of("model.layers.2.mlp.up_proj.weight") == layers[2]


# -- hooks --------------------------------------------------------------------------------------

class Seen(nn.Module):
    """Reports the device and dtype each input arrived with."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(2, dtype=torch.float16, device="meta"))

    def forward(self, x: torch.Tensor, extra: dict[str, Any]) -> dict[str, Any]:
        return {"x": (x.device.type, x.dtype),
                "ids": (extra["ids"][0].device.type, extra["ids"][0].dtype),
                "pair": [(t.device.type, t.dtype) for t in extra["pair"]]}


def test_align_inputs_moves_and_casts_nested_inputs_to_the_module() -> None:
    # The module lives on "meta" here, standing in for a GPU: what arrives shows the move.
    module = Seen()
    install_hooks(module, Placement({"": torch.device("meta")}), align_inputs=True)
    seen = module(torch.randn(3), extra={"ids": [torch.tensor([1, 2])],
                                         "pair": (torch.randn(1, dtype=torch.float64),
                                                  torch.tensor(True))})
    assert seen["x"] == ("meta", torch.float16)
    assert seen["ids"] == ("meta", torch.int64), "integer tensors are moved, never cast"
    assert seen["pair"] == [("meta", torch.float16), ("meta", torch.bool)]


class Pair(NamedTuple):
    a: torch.Tensor
    b: list[torch.Tensor]


def test_convert_keeps_container_types() -> None:
    out = convert(OrderedDict(p=Pair(torch.ones(1), [torch.ones(1, dtype=torch.float64)])),
                  torch.device("cpu"), torch.float16)
    assert isinstance(out, OrderedDict) and isinstance(out["p"], Pair)
    assert out["p"].a.dtype == torch.float16 and out["p"].b[0].dtype == torch.float16


def test_fp16_pull_takes_a_float32_batch_with_align_inputs(reg: Registry) -> None:
    model = trained_mlp().half()
    reg.push(model, "mlp", factory=MLP)
    plain = reg.pull("mlp", device="cpu", dtype="float16")
    batch = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="dtype|Half|Float"):
        plain(batch)
    aligned = reg.pull("mlp", device="cpu", dtype="float16", align_inputs=True)
    out = aligned(batch)
    assert out.device == batch.device
    assert torch.equal(out, plain(batch.half()))
    assert torch.equal(aligned(batch), out), "the hooks stay balanced across calls"


def test_align_inputs_hook_pair_survives_a_failing_forward(reg: Registry) -> None:
    reg.push(trained_mlp(), "mlp", factory=MLP)
    aligned = reg.pull("mlp", device="cpu", align_inputs=True)
    with pytest.raises(RuntimeError):
        aligned(torch.randn(4, 3))  # wrong width
    assert aligned(torch.randn(4, 8)).shape == (4, 3)


def test_tied_gpt2_pulls_with_device_map_auto_on_cpu(reg: Registry) -> None:
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = _gpt2()
    reg.push(model, "gpt2")
    pulled = reg.pull("gpt2", model=lambda: tf.GPT2LMHeadModel(model.config),
                      device_map="auto", max_memory={"cpu": "1GiB"}, align_inputs=True)
    assert pulled.lm_head.weight is pulled.transformer.wte.weight
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(pulled(ids).logits, model(ids).logits)


# -- a real split forward pass (skipped without CUDA) --------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("build", [_gpt2, _t5, _llama], ids=["gpt2", "t5", "llama"])
def test_split_forward_pass_on_a_real_gpu_and_the_cpu(reg: Registry,
                                                      build: Callable[[], nn.Module]) -> None:
    torch.manual_seed(0)
    model = build()
    reg.push(model, "m")
    manifest = reg.show("m").metadata
    half = int(manifest["source"]["size_bytes"]) // 2
    pulled = reg.pull("m", model=lambda: type(model)(model.config), device_map="auto",
                      max_memory={"cuda:0": half, "cpu": "4GiB"}, align_inputs=True)
    devices = {p.device.type for p in pulled.parameters()}
    assert devices == {"cuda", "cpu"}
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    kwargs = {"decoder_input_ids": ids} if "T5" in type(model).__name__ else {}
    with torch.no_grad():
        expected = model(ids, **kwargs).logits
        got = pulled(ids, **kwargs).logits
    assert got.device.type == "cpu", "outputs come back where the inputs were"
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_fp16_on_gpu_takes_a_cpu_float32_batch(reg: Registry) -> None:
    reg.push(trained_mlp().half(), "mlp", factory=MLP)
    aligned = reg.pull("mlp", device="cuda", align_inputs=True)
    assert aligned.fc1.weight.dtype == torch.float16
    out = aligned(torch.randn(4, 8))
    assert out.device.type == "cpu"
