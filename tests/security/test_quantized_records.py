"""Quantization and adapter records are untrusted (issue 35): a record naming an unknown library
or a code path, packed tensors that disagree with their config, an adapter whose targets its base
lacks or whose base digest is not stored: each a typed error, and nothing imported for it."""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from registry import (
    AdapterError,
    BaseNotFoundError,
    QuantizationError,
    Registry,
    StateDictMismatchError,
)
from tests.security.test_manifests import _edit_catalog, _manifest

torchao = pytest.importorskip("torchao")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
from torchao.quantization import Int8WeightOnlyConfig, quantize_  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                                        "ignore::FutureWarning")


def _float() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _int8(reg: Registry) -> dict[str, Any]:
    model = _float()
    quantize_(model, Int8WeightOnlyConfig())
    reg.push(model, "q")
    return _manifest(reg, "q:v1")


def _dynamic(reg: Registry) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.ao.quantization.quantize_dynamic(_float(), {nn.Linear}, dtype=torch.qint8)
    reg.push(model, "q")
    return _manifest(reg, "q:v1")


def _tamper(reg: Registry, manifest: dict[str, Any]) -> None:
    _edit_catalog(reg, "q", 1, manifest=json.dumps(manifest))


def _set_type(m: dict[str, Any], value: str) -> None:
    m["quantization"]["config"]["0.weight"]["_type"] = value


def _set_dtype(m: dict[str, Any], value: str) -> None:
    m["quantization"]["config"]["0.weight"]["_data"]["dtype"]["_data"] = value


def _set_nested(m: dict[str, Any], value: str) -> None:
    m["quantization"]["config"]["0.weight"]["_data"]["act_quant_kwargs"] = {
        "_type": value, "_data": {}}


@pytest.mark.parametrize(("edit", "match"), [
    (lambda m: m["quantization"].update(library="evil_quant_lib"), "not a scheme this registry"),
    (lambda m: m["quantization"].update(method="int2_magic"), "not a scheme this registry"),
    (lambda m: _set_type(m, "os:system"), "not a torchao tensor type"),
    (lambda m: _set_dtype(m, "load"), "the dtype 'load'"),
    (lambda m: _set_nested(m, "subprocess.Popen"), "which torchao does not allow"),
    (lambda m: m["quantization"].update(float_params=-1), "not a count"),
], ids=["library", "method", "tensor-type", "dtype-name", "nested-type", "count"])
def test_a_quantization_record_naming_code_is_refused_and_nothing_imported(
        reg: Registry, edit: Any, match: str) -> None:
    manifest = _int8(reg)
    edit(manifest)
    _tamper(reg, manifest)
    before = set(sys.modules)
    with pytest.raises(QuantizationError, match=match):
        reg.pull("q:v1", device="cpu", model=_float)
    assert set(sys.modules) - before == set()  # nothing imported for the record
    assert "evil_quant_lib" not in sys.modules


def test_int8_components_that_disagree_with_the_block_size_are_refused(reg: Registry) -> None:
    manifest = _int8(reg)
    # The scale holds one entry per row of 16; a block size of 8 needs two per row.
    manifest["quantization"]["config"]["0.weight"]["_data"]["block_size"] = [1, 8]
    _tamper(reg, manifest)
    with pytest.raises(QuantizationError, match=r"disagree with its quantization config"):
        reg.pull("q:v1", device="cpu", model=_float)


def test_int4_records_that_disagree_with_their_tensors_are_refused(
        reg: Registry) -> None:
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    model = _float()
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(8)))
    reg.push(model, "q")
    manifest = _manifest(reg, "q:v1")
    # Stored: scale and zero point [32, 2] for 16 columns in groups of 8; groups of 4 need
    # [32, 4] each (torchao's own constructor checks it; the error is ours).
    manifest["quantization"]["config"]["0.weight"]["_data"]["block_size"] = [1, 4]
    _tamper(reg, manifest)
    with pytest.raises(QuantizationError, match=r"could not be rebuilt .*shape \[32, 4\]"):
        reg.pull("q:v1", device="cpu", model=_float)
    manifest["quantization"]["config"]["0.weight"]["_data"]["block_size"] = [1, 8]
    manifest["quantization"]["weight_dtypes"] = ["int4; rm -rf"]
    _tamper(reg, manifest)
    with pytest.raises(QuantizationError, match=r"weight_dtypes .*not a list of int1"):
        reg.pull("q:v1", device="cpu", model=_float)
    # A record whose width is not its tensors' (show would print a width they do not have).
    manifest["quantization"]["weight_dtypes"] = ["int4"]
    manifest["quantization"]["config"]["0.weight"]["_data"]["target_dtype"]["_data"] = "int2"
    _tamper(reg, manifest)
    with pytest.raises(QuantizationError, match=r"weight_dtypes \['int4'\] while its tensors"):
        reg.pull("q:v1", device="cpu", model=_float)


def test_a_recorded_logical_shape_that_is_not_the_data_is_refused(reg: Registry) -> None:
    manifest = _int8(reg)
    manifest["quantization"]["shapes"]["0.weight"] = [32, 8]
    _tamper(reg, manifest)
    with pytest.raises((QuantizationError, StateDictMismatchError)):
        reg.pull("q:v1", device="cpu", model=_float)


@pytest.mark.parametrize(("field", "value"), [
    ("in_features", 8), ("out_features", 64), ("qscheme", "per_channel_affine"), ("bias", False),
])
def test_dynamic_packed_tensors_that_disagree_with_the_config_are_refused(
        reg: Registry, field: str, value: Any) -> None:
    manifest = _dynamic(reg)
    manifest["quantization"]["modules"][0][field] = value
    _tamper(reg, manifest)
    with pytest.raises((QuantizationError, StateDictMismatchError)) as info:
        reg.pull("q:v1", device="cpu", model=_float)
    if field == "qscheme":  # the module still fits: the packed tensors disagree
        assert isinstance(info.value, QuantizationError)


# -- adapters --------------------------------------------------------------------------------------

def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32, bos_token_id=0,
        eos_token_id=0))


def _adapter(reg: Registry) -> dict[str, Any]:
    reg.push(_gpt2(), "base")
    tuned = peft.get_peft_model(_gpt2(), peft.LoraConfig(r=2, target_modules=["c_attn"],
                                                         fan_in_fan_out=True))
    reg.push(tuned, "q", base="base:v1")
    return _manifest(reg, "q:v1")


@pytest.mark.parametrize(("edit", "error", "match"), [
    (lambda a: a["config"].update(target_modules=["no_such_layer"]), AdapterError,
     "base does not have"),
    (lambda a: a["config"].update(target_modules=["os.system()"]), AdapterError,
     "not a list of module names"),
    (lambda a: a["config"].update(megatron_config={"x": 1}, megatron_core="evil_mod"),
     AdapterError, "megatron_config"),
    (lambda a: a["config"].update(init_lora_weights="loftq"), AdapterError,
     "init_lora_weights"),
    (lambda a: a.update(library="evil_adapters"), AdapterError, "not a peft LoRA adapter"),
    (lambda a: a["base"].update(digest="sha256:" + "0" * 64), BaseNotFoundError,
     "is not stored"),
], ids=["absent-target", "target-code", "megatron", "loftq", "library", "base-digest"])
def test_a_hostile_adapter_record_is_refused(reg: Registry, edit: Any, error: type,
                                             match: str) -> None:
    manifest = _adapter(reg)
    edit(manifest["adapter"])
    _tamper(reg, manifest)
    before = set(sys.modules)
    with pytest.raises(error, match=match):
        reg.pull("q:v1", device="cpu")
    assert not {"evil_mod", "evil_adapters"} & set(sys.modules)
    assert not {m for m in set(sys.modules) - before if m.startswith("megatron")}


def test_quantized_and_adapter_manifests_are_format_3_and_an_older_reader_refuses_them(
        reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry import ManifestError
    from registry import manifest as mf

    plain = reg.push(_float(), "plain")
    assert plain.metadata["format_version"] == mf.FORMAT_VERSION == 2
    quantized = _int8(reg)
    assert quantized["format_version"] == mf.EXTENDED_FORMAT == 3
    reg.push(_gpt2(), "base")
    tuned = peft.get_peft_model(_gpt2(), peft.LoraConfig(r=2, target_modules=["c_attn"],
                                                         fan_in_fan_out=True))
    assert reg.push(tuned, "lora", base="base:v1").metadata["format_version"] == 3
    # A format-2 manifest carrying a quantization record is refused, not read as floats.
    downgraded = {**quantized, "format_version": 2}
    with pytest.raises(ManifestError, match="format_version.*3 in a manifest with 'quantization'"):
        mf.validate(downgraded, origin="q:v1")
    # A reader from before format 3 (it reads 1 and 2) says to upgrade; floats it still reads.
    monkeypatch.setattr(mf, "READABLE_FORMATS", (1, 2))
    monkeypatch.setattr(mf, "EXTENDED_FORMAT", 2)
    with pytest.raises(ManifestError, match="format_version 3, newer than this registry.*upgrade"):
        mf.validate(quantized, origin="q:v1")
    assert mf.validate(_manifest(reg, "plain:v1"), origin="plain:v1")


@pytest.fixture(scope="module")
def packed_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("compressed_tensors")
    from tests.integration.test_compressed_tensors import _checkpoint

    return _checkpoint(tmp_path_factory.mktemp("ct"))


def _group(m: dict[str, Any]) -> dict[str, Any]:
    return m["quantization"]["config"]["config_groups"]["group_0"]


@pytest.mark.parametrize(("edit", "match"), [
    (lambda m: m["quantization"]["config"].update(format="marlin-24"),
     "only 'pack-quantized' is loaded"),
    (lambda m: m["quantization"]["config"].update(transform_config={"x": {"_type": "os.system"}}),
     "more than weights"),
    (lambda m: m["quantization"]["config"].update(loader="evil_quant_lib"),
     "config key 'loader'"),
    (lambda m: _group(m).update(input_activations={"num_bits": 8, "type": "int"}),
     "only weight-only schemes"),
    (lambda m: _group(m)["weights"].update(observer_kwargs={"cls": "evil_quant_lib.X"}),
     "not int1..int8"),
    (lambda m: _group(m)["weights"].update(group_size=16),
     r"packed tensors of 'model\.layers\.0\.\S+' .*disagree with its quantization config"),
    (lambda m: m["quantization"]["config"].update(ignore=["lm_head", "re:.*up_proj"]),
     "quantizes .* not the packed modules"),
    (lambda m: m["quantization"]["modules"].pop("model.layers.0.mlp.up_proj"),
     "does not fit the model"),
], ids=["format", "transform", "key", "activations", "observer", "group-size", "ignore",
    "modules"])
def test_a_hostile_compressed_tensors_record_is_refused(reg: Registry, packed_checkpoint: Any,
                                                        edit: Any, match: str) -> None:
    from tests.integration.test_compressed_tensors import _load

    reg.push(_load(packed_checkpoint), "q")
    manifest = _manifest(reg, "q:v1")
    edit(manifest)
    _tamper(reg, manifest)
    before = set(sys.modules)
    with pytest.raises((QuantizationError, StateDictMismatchError), match=match):
        reg.pull("q:v1", device="cpu")
    assert "evil_quant_lib" not in sys.modules and not {
        m for m in set(sys.modules) - before if m.startswith("os.")}
