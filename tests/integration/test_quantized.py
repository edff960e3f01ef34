"""Quantized versions (issue 35): torchao subclasses and quantize_dynamic modules stored as plain
component tensors plus a scheme record, pulled back quantized onto devices that run the scheme,
refused (or dequantized on request) elsewhere."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from registry import Registry
from registry.errors import NormalizationError, SchemeDeviceError
from tests.helpers import fake_devices

torchao = pytest.importorskip("torchao")
from torchao.prototype.safetensors.safetensors_support import (  # noqa: E402
    flatten_tensor_state_dict,
)
from torchao.quantization import (  # noqa: E402
    Float8WeightOnlyConfig,
    Int8DynamicActivationIntxWeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    quantize_,
)
from torchao.quantization.granularity import PerGroup  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def _float() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _torchao(config: object) -> nn.Module:
    model = _float()
    quantize_(model, config)
    return model


def _dynamic(qconfig: object = None) -> nn.Module:
    spec = {nn.Linear: qconfig} if qconfig is not None else {nn.Linear}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(_float(), spec, dtype=torch.qint8)


def _stored_components(reg: Registry, ref: str) -> dict[str, torch.Tensor]:
    """The component tensors exactly as the store holds them."""
    from registry.refs import parse

    record = reg.backend.resolve(parse(ref))
    out: dict[str, torch.Tensor] = {}
    for f in record.manifest["files"]:
        with safe_open(reg.backend.blob_path(f["digest"], f["size"]), "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118
    return out


# torchao's int4 weight-only for the CPU: int4 values unpacked one per int8, by groups of 8.
INT4_CPU = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(8))
INT8_DA_INT4 = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4,
                                                     weight_granularity=PerGroup(8))


@pytest.mark.parametrize(("config", "method", "devices", "groups"), [
    (Int8WeightOnlyConfig(), "int8_weight_only", ["cpu", "cuda"], [16, 32]),
    (Float8WeightOnlyConfig(), "float8_weight_only", ["cpu", "cuda (capability >= 8.9)"],
     [16, 32]),
    (INT4_CPU, "intx_weight_only", ["cpu", "cuda"], [8]),
    (INT8_DA_INT4, "int8_dynamic_activation_intx_weight", ["cpu", "cuda"], [8]),
], ids=["int8", "float8", "int4-cpu", "int8-act-int4"])
def test_a_torchao_module_round_trips_quantized(reg: Registry, config: object, method: str,
                                                devices: list[str], groups: list[int]) -> None:
    pushed = _torchao(config)
    mv = reg.push(pushed, "q")
    scheme = mv.metadata["quantization"]
    assert (scheme["library"], scheme["method"]) == ("torchao", method)
    assert scheme["library_version"] == torchao.__version__
    assert scheme["devices"] == devices
    assert scheme["group_sizes"] == groups  # int8/float8: one scale per row, the rows' lengths
    assert scheme.get("weight_dtypes") == (["int4"] if "intx" in method else None)
    assert scheme["float_params"] == 16 * 32 + 32 + 32 * 8 + 8
    assert mv.metadata["source"]["params"] == scheme["float_params"]
    flat, _ = flatten_tensor_state_dict(pushed.state_dict())
    stored_bytes = sum(t.numel() * t.element_size() for t in flat.values())
    assert scheme["stored_bytes"] == mv.metadata["source"]["size_bytes"] == stored_bytes
    assert stored_bytes < 0.5 * scheme["float_params"] * 4  # int8/fp8 weights, not floats

    # Stored without pickle: the store holds torchao's own flattened components, plain tensors.
    stored = _stored_components(reg, mv.ref)
    assert set(stored) == set(flat)
    for key, t in flat.items():
        assert torch.equal(stored[key].view(torch.uint8), t.contiguous().view(torch.uint8)), key

    pulled = reg.pull(mv.ref, device="cpu", model=_float)
    assert type(pulled[0].weight) is type(pushed[0].weight)
    back, _ = flatten_tensor_state_dict(pulled.state_dict())
    for key, t in flat.items():  # byte-identical components
        assert back[key].dtype == t.dtype
        assert torch.equal(back[key].view(torch.uint8), t.contiguous().view(torch.uint8)), key
    x = torch.randn(4, 16)
    torch.testing.assert_close(pulled(x), pushed(x))


def test_a_dynamically_quantized_module_round_trips(reg: Registry) -> None:
    for qconfig in (None, torch.ao.quantization.per_channel_dynamic_qconfig):
        pushed = _dynamic(qconfig)
        mv = reg.push(pushed, "dq")
        scheme = mv.metadata["quantization"]
        assert (scheme["library"], scheme["method"], scheme["devices"]) == \
            ("torch.ao", "dynamic_qint8", ["cpu"])
        assert scheme["float_params"] == 16 * 32 + 32 + 32 * 8 + 8
        pulled = reg.pull(mv.ref, device="cpu", model=_float)
        for path in ("0", "2"):
            got, want = (m.get_submodule(path)._packed_params._weight_bias()[0]
                         for m in (pulled, pushed))
            assert got.qscheme() == want.qscheme()
            assert torch.equal(got.int_repr(), want.int_repr())
            assert torch.equal(got.dequantize(), want.dequantize())
        x = torch.randn(4, 16)
        torch.testing.assert_close(pulled(x), pushed(x))


def test_a_dynamic_version_pulls_into_the_quantized_skeleton_as_into_the_float_builder(
        reg: Registry) -> None:
    """model= may be what the user holds after quantizing: quantize_dynamic(MyNet(), ...)."""
    pushed = _dynamic(torch.ao.quantization.per_channel_dynamic_qconfig)
    mv = reg.push(pushed, "dq")
    x = torch.randn(4, 16)
    for model in (_float, _dynamic, _dynamic()):
        pulled = reg.pull(mv.ref, device="cpu", model=model)
        for path in ("0", "2"):
            got = pulled.get_submodule(path)._packed_params._weight_bias()[0]
            want = pushed.get_submodule(path)._packed_params._weight_bias()[0]
            assert torch.equal(got.int_repr(), want.int_repr())
            assert got.qscheme() == want.qscheme()
        torch.testing.assert_close(pulled(x), pushed(x))


def test_a_quantized_state_dict_is_still_refused_with_the_way_out(reg: Registry) -> None:
    with pytest.raises(NormalizationError, match="packed quantized parameters"):
        reg.push(_dynamic().state_dict(), "q")
    # torchao's subclasses in a bare dict: a typed error, not torch's "invalid python storage".
    with pytest.raises(NormalizationError, match="push the quantized module itself"):
        reg.push(_torchao(Int8WeightOnlyConfig()).state_dict(), "q")
    assert reg.list_models() == []


def test_a_transformers_model_loaded_with_a_quantization_config(reg: Registry,
                                                                 tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      vocab_size=100)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "float", dtype=torch.float32,
        quantization_config=transformers.TorchAoConfig(Int8WeightOnlyConfig()))
    mv = reg.push(model, "llama-int8")
    assert mv.metadata["architecture"]["class"] == "transformers:LlamaForCausalLM"
    assert mv.metadata["quantization"]["method"] == "int8_weight_only"
    assert mv.metadata["quantization"]["hf_quantization_config"]["quant_method"] == "torchao"
    pulled = reg.pull(mv.ref, device="cpu")  # rebuilt from the recorded config, no model=
    assert type(pulled.model.layers[0].self_attn.q_proj.weight).__name__ == "Int8Tensor"
    ids = torch.randint(0, 100, (1, 8))
    torch.testing.assert_close(pulled(ids).logits, model(ids).logits)


def test_a_tied_head_quantized_apart_from_its_embeddings_comes_back_quantized(
        reg: Registry) -> None:
    """torchao's quantize_ on a model whose config ties lm_head to the embeddings (GPT-2 here;
    Llama 3.2, Qwen and Gemma too) gives lm_head a quantized weight of its own; the pull keeps
    it quantized and apart instead of tying the float embeddings back over it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, bos_token_id=0, eos_token_id=0)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    assert type(model.lm_head.weight).__name__ == "Int8Tensor"
    mv = reg.push(model, "gpt2-int8")
    pulled = reg.pull(mv.ref, device="cpu")
    assert type(pulled.lm_head.weight) is type(model.lm_head.weight)
    assert type(pulled.transformer.wte.weight) is nn.Parameter
    flat, _ = flatten_tensor_state_dict(model.state_dict())
    back, _ = flatten_tensor_state_dict(pulled.state_dict())
    assert set(back) == set(flat)
    for key, t in flat.items():  # byte-identical components, the embeddings' floats included
        assert torch.equal(back[key].view(torch.uint8), t.contiguous().view(torch.uint8)), key
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(pulled(ids).logits, model(ids).logits)


# -- devices ---------------------------------------------------------------------------------------

def test_a_device_without_kernels_for_the_scheme_is_refused(
        reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    reg.push(_dynamic(), "dq")
    reg.push(_torchao(Float8WeightOnlyConfig()), "f8")
    fake_devices(monkeypatch, cuda=[(8 * 2**30, (8, 0))])
    with pytest.raises(SchemeDeviceError) as info:
        reg.pull("dq", device="cuda:0", model=_float)
    message = str(info.value)
    assert "torch.ao dynamic_qint8" in message and "cuda:0" in message
    assert "runs on: cpu" in message and "dtype='float32'" in message
    with pytest.raises(SchemeDeviceError, match=r"cuda \(capability >= 8.9\)"):
        reg.pull("f8", device="cuda", model=_float)  # an A100 (8.0) has no float8 kernels
    # "auto" picks a device that runs the scheme rather than the GPU that cannot.
    assert reg.pull("dq", model=_float)[0]._packed_params._weight_bias()[0].device.type == "cpu"


def test_asking_for_floats_dequantizes_on_load_and_says_so(
        reg: Registry, caplog: pytest.LogCaptureFixture) -> None:
    for pushed, name in ((_dynamic(), "dq"), (_torchao(Int8WeightOnlyConfig()), "i8")):
        reg.push(pushed, name)
        with caplog.at_level(logging.INFO, logger="registry.formats"):
            pulled = reg.pull(name, device="cpu", dtype="bfloat16", model=_float)
        assert f"{name}:v1: dequantizing" in caplog.text and "bfloat16" in caplog.text
        assert type(pulled[0]) is nn.Linear
        assert type(pulled[0].weight) is nn.Parameter
        assert pulled[0].weight.dtype == torch.bfloat16
        x = torch.randn(4, 16)
        torch.testing.assert_close(pulled(x.bfloat16()).float(), pushed(x), atol=0.1, rtol=0.1)


def test_device_map_auto_plans_quantized_modules_by_their_stored_bytes(
        reg: Registry) -> None:
    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    model = Deep()
    quantize_(model, Int8WeightOnlyConfig())
    mv = reg.push(model, "deep")
    # A layer's float weight is 16 KiB; stored as int8 (plus scales) it is about 4.5 KiB: a
    # CPU budget of 20 KB holds all four layers when planned by stored bytes (not by float
    # bytes), and one of 10 KB does not (the stored components count, not nothing).
    from registry.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="no device has that much left"):
        reg.pull(mv.ref, model=Deep, device_map="auto", max_memory={"cpu": 10_000})
    pulled = reg.pull(mv.ref, model=Deep, device_map="auto", max_memory={"cpu": 20_000})
    assert type(pulled.layers[3].weight).__name__ == "Int8Tensor"
    x = torch.randn(2, 64)
    torch.testing.assert_close(pulled(x), model(x))


def test_show_names_the_scheme(reg: Registry) -> None:
    from registry.display import version_table

    mv = reg.push(_torchao(Int8WeightOnlyConfig()), "q")
    table = version_table(reg.show(mv.ref))
    assert "quantization" in table and "torchao 0." in table and "int8_weight_only" in table
    assert "runs on cpu, cuda" in table
    assert json.dumps(reg.show(mv.ref).to_dict()["metadata"]["quantization"])


@pytest.mark.parametrize(("scheme", "kind"), [
    (Int8WeightOnlyConfig(), "Int8Tensor"), (INT4_CPU, "IntxUnpackedToInt8Tensor"),
], ids=["int8", "int4-cpu"])
def test_save_pretrained_of_a_quantized_transformers_model_loads_back_quantized(
        reg: Registry, tmp_path: Path, scheme: object, kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      vocab_size=100)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "float")
    model = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "float", dtype=torch.float32,
        quantization_config=transformers.TorchAoConfig(scheme))
    mv = reg.push(model, "llama-q")
    out = reg.save_pretrained(mv.ref, tmp_path / "hf")
    written = json.loads((out / "config.json").read_text())
    assert written["quantization_config"]["quant_method"] == "torchao"
    back = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(back.model.layers[0].mlp.up_proj.weight).__name__ == kind
    ids = torch.randint(0, 100, (1, 8))
    torch.testing.assert_close(back(ids).logits, model(ids).logits)


def test_save_pretrained_refuses_what_transformers_could_not_load_quantized(
        reg: Registry, tmp_path: Path) -> None:
    from registry.errors import QuantizationError

    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=100))
    quantize_(model, Int8WeightOnlyConfig())  # quantized without a quantization_config
    mv = reg.push(model, "llama-int8")
    with pytest.raises(QuantizationError, match="without a transformers quantization_config"):
        reg.save_pretrained(mv.ref, tmp_path / "hf")


def test_the_mlflow_mirror_shows_the_scheme(reg: Registry) -> None:
    from registry.mirror.mlflow_view import describe, version_tags
    from registry.refs import parse

    mv = reg.push(_torchao(Int8WeightOnlyConfig()), "q")
    record = reg.backend.resolve(parse(mv.ref))
    assert version_tags(record, "file:///x")["registry.quantization"] == \
        "torchao int8_weight_only"
    assert "| quantization | torchao" in describe(record)
    int4 = reg.backend.resolve(parse(reg.push(_torchao(INT4_CPU), "q4").ref))
    assert version_tags(int4, "file:///x")["registry.quantization"] == \
        "torchao intx_weight_only int4"


def test_int4_weight_only_on_the_cpu(reg: Registry) -> None:
    """torchao's intx int4 runs on the CPU: show names its width, floats are one dtype= away,
    and a device without CUDA kernels is never asked for (it runs on any CUDA device too)."""
    from registry.display import version_table

    pushed = _torchao(INT4_CPU)
    mv = reg.push(pushed, "q4")
    table = version_table(reg.show(mv.ref))
    assert "intx_weight_only int4 (group sizes 8; runs on cpu, cuda)" in table
    x = torch.randn(4, 16)
    floats = reg.pull(mv.ref, device="cpu", dtype="float32", model=_float)
    assert not hasattr(floats[0].weight, "qdata") and floats[0].weight.dtype == torch.float32
    torch.testing.assert_close(floats(x), pushed(x))
    state = reg.pull_state_dict(mv.ref, device="cpu")
    assert list(state) == list(pushed.state_dict())
    assert torch.equal(state["0.weight"].qdata, pushed[0].weight.qdata)
    assert torch.equal(state["0.weight"].zero_point, pushed[0].weight.zero_point)


def test_int4_which_has_no_cpu_kernels_is_refused_on_the_cpu(reg: Registry) -> None:
    """torchao's int4 cannot be built here (Int4WeightOnlyConfig needs mslk): a version that
    records it, made by relabelling an int8 one, is refused on the CPU before anything loads."""
    from registry.errors import SchemeDeviceError as Refused
    from tests.security.test_manifests import _edit_catalog, _manifest

    reg.push(_torchao(Int8WeightOnlyConfig()), "q")
    manifest = _manifest(reg, "q:v1")
    manifest["quantization"]["method"] = "int4_weight_only"
    _edit_catalog(reg, "q", 1, manifest=json.dumps(manifest))
    for device in ("cpu", "auto"):
        with pytest.raises(Refused, match=r"int4_weight_only.*runs on: cuda \(capability >= "
                                          r"8.0\)"):
            reg.pull("q:v1", device=device, model=_float)


def test_pull_state_dict_of_a_quantized_version(reg: Registry) -> None:
    """torchao: its tensor subclasses under the module's keys, as the quantized model's own
    state_dict() holds them; torch.ao's packed modules: a typed error pointing at pull(), or
    floats on request. dtype= dequantizes either."""
    from registry.errors import QuantizationError

    pushed = _torchao(Int8WeightOnlyConfig())
    mv = reg.push(pushed, "q")
    state = reg.pull_state_dict(mv.ref, device="cpu")
    want = pushed.state_dict()
    assert list(state.keys()) == list(want.keys())  # the quantized model's own order
    assert type(state["0.weight"]) is type(want["0.weight"])
    assert torch.equal(state["0.weight"].dequantize(), want["0.weight"].dequantize())
    floats = reg.pull_state_dict(mv.ref, device="cpu", dtype="float32")
    assert list(floats.keys()) == list(_float().state_dict().keys())
    assert type(floats["0.weight"]) is torch.Tensor and floats["0.weight"].dtype == torch.float32
    plain = _float()
    plain.load_state_dict(floats)
    x = torch.randn(4, 16)
    torch.testing.assert_close(plain(x), pushed(x))

    dynamic = _dynamic()
    dq = reg.push(dynamic, "dq")
    with pytest.raises(QuantizationError, match=r"registry\.pull\(ref, model=\.\.\.\).*float32"):
        reg.pull_state_dict(dq.ref, device="cpu")
    plain = _float()
    dequantized = reg.pull_state_dict(dq.ref, device="cpu", dtype="float32")
    assert list(dequantized.keys()) == list(plain.state_dict().keys())
    plain.load_state_dict(dequantized)
    torch.testing.assert_close(plain(x), dynamic(x), atol=0.05, rtol=0.05)
