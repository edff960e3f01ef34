"""compressed-tensors pack-quantized versions (issue 35): a transformers model loaded from an
int4 checkpoint on the CPU is stored as its packed int32 components (safetensors, no pickle),
pulls back with the same bytes and outputs, and writes a from_pretrained directory transformers
loads quantized. The checkpoint is made here from a tiny config with the library's own helpers."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from registry import Registry
from registry.errors import QuantizationError

transformers = pytest.importorskip("transformers")
compressed_tensors = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                                        "ignore::FutureWarning")
GROUP = 32
IDS = torch.tensor([[1, 5, 9, 42, 7, 3, 11, 2]])


def _config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2)


def _checkpoint(root: Path) -> Path:
    """An int4, group-32, pack-quantized checkpoint as llm-compressor would write it."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).eval()
    weights = QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=GROUP,
                               symmetric=True)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=["lm_head"], format="pack-quantized"))
    for _, module in model.named_modules():
        if hasattr(module, "weight_scale"):  # min-max calibration, one scale per group
            w = module.weight.data.reshape(module.weight.shape[0], -1, GROUP)
            scale, _ = calculate_qparams(w.amin(-1), w.amax(-1), weights)
            module.weight_scale.data.copy_(scale)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    out = root / "ckpt"
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return out


def _load(path: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(path).eval()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for key, t in want.items():
        assert got[key].dtype == t.dtype, key
        assert torch.equal(_bytes(got[key]), _bytes(t)), key


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("ct"))


def test_a_pack_quantized_model_round_trips_packed(reg: Registry, checkpoint: Path) -> None:
    pushed = _load(checkpoint)
    packed = {k: v.clone() for k, v in pushed.state_dict().items()}
    assert packed["model.layers.0.mlp.up_proj.weight_packed"].dtype == torch.int32
    mv = reg.push(pushed, "llama-int4")

    scheme = mv.metadata["quantization"]
    assert (scheme["library"], scheme["method"]) == ("compressed-tensors", "pack-quantized")
    assert scheme["library_version"] == compressed_tensors.__version__
    assert scheme["config"]["quant_method"] == "compressed-tensors"
    assert scheme["config"]["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    assert scheme["group_sizes"] == [GROUP]
    assert scheme["devices"] == ["cpu", "cuda"]
    floats = sum(p.numel() for p in transformers.LlamaForCausalLM(_config()).parameters())
    assert scheme["float_params"] == mv.metadata["source"]["params"] == floats
    assert scheme["stored_bytes"] == sum(t.numel() * t.element_size() for t in packed.values())
    assert scheme["modules"]["model.layers.1.mlp.down_proj"] == {"group": "group_0",
                                                                "shape": [64, 128]}
    assert mv.metadata["format_version"] == 3

    # Stored without pickle: safetensors files holding the packed tensors byte for byte.
    stored: dict[str, torch.Tensor] = {}
    for f in mv.metadata["files"]:
        with safe_open(reg.backend.blob_path(f["digest"], f["size"]), "pt") as fh:
            stored.update({k: fh.get_tensor(k) for k in fh.keys()})  # noqa: SIM118
    _same(stored, packed)

    pulled = reg.pull(mv.ref, device="cpu")
    assert type(pulled) is transformers.LlamaForCausalLM
    assert pulled.config.quantization_config.quant_method == "compressed-tensors"
    _same(dict(pulled.state_dict()), packed)
    with torch.no_grad():
        torch.testing.assert_close(pulled(IDS).logits, pushed(IDS).logits)
        torch.testing.assert_close(pulled(IDS).logits, _load(checkpoint)(IDS).logits)


def test_a_model_decompressed_by_a_forward_is_packed_again(reg: Registry,
                                                           checkpoint: Path) -> None:
    model = _load(checkpoint)
    packed = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        want = model(IDS).logits  # compressed-tensors unpacks the weights on the first forward
    assert "model.layers.0.mlp.up_proj.weight" in model.state_dict()
    mv = reg.push(model, "llama-int4")
    assert set(mv.metadata["tensors"]) == set(packed)
    pulled = reg.pull(mv.ref, device="cpu")
    _same(dict(pulled.state_dict()), packed)
    with torch.no_grad():
        torch.testing.assert_close(pulled(IDS).logits, want)


def test_save_pretrained_keeps_the_quantization_config(reg: Registry, checkpoint: Path,
                                                       tmp_path: Path) -> None:
    pushed = _load(checkpoint)
    packed = {k: v.clone() for k, v in pushed.state_dict().items()}
    mv = reg.push(pushed, "llama-int4")
    out = reg.save_pretrained(mv.ref, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    assert config["quantization_config"]["format"] == "pack-quantized"
    loaded = _load(out)
    _same(dict(loaded.state_dict()), packed)  # transformers loaded it packed, not as floats
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, pushed(IDS).logits)
    with pytest.raises(QuantizationError, match="pass dtype='auto'"):
        reg.save_pretrained(mv.ref, tmp_path / "cast", dtype="float32")


def test_pull_state_dict_gives_the_packed_state_or_floats_on_request(
        reg: Registry, checkpoint: Path, caplog: pytest.LogCaptureFixture) -> None:
    pushed = _load(checkpoint)
    packed = {k: v.clone() for k, v in pushed.state_dict().items()}
    with torch.no_grad():
        want = pushed(IDS).logits
    mv = reg.push(_load(checkpoint), "llama-int4")
    # As the compressed model's own state_dict() holds it.
    state = reg.pull_state_dict(mv.ref, device="cpu")
    _same(dict(state), packed)
    assert list(state.keys()) == list(packed.keys())
    with caplog.at_level(logging.INFO, logger="registry.formats.ctensors"):
        floats = reg.pull_state_dict(mv.ref, device="cpu", dtype="float32")
    assert "dequantizing compressed-tensors pack-quantized to float32" in caplog.text
    plain = transformers.LlamaForCausalLM(_config()).eval()
    plain.load_state_dict(floats, strict=True)  # the float model's keys and shapes
    assert list(floats.keys()) == list(plain.state_dict().keys())
    with torch.no_grad():
        torch.testing.assert_close(plain(IDS).logits, want)
    # And a pull with dtype= gives the same plain float model.
    dense = reg.pull(mv.ref, device="cpu", dtype="float32")
    assert not any(k.endswith("weight_packed") for k in dense.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(dense(IDS).logits, want)
