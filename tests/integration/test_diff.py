"""`Registry.diff` and `registry diff`: exactly what changed, norms equal to torch's, and no
byte of a shard both versions hold is read."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import registry
from registry.backends import LocalBackend
from tests.helpers import block_lm, clean_env, run_cli

SHARD = "16KiB"


def _tuned(seed: int = 0) -> torch.nn.Module:
    model = block_lm(seed)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.layers[2].parameters():
            p.add_(torch.randn_like(p) * 0.01)
    return model


def _count_opens(reg: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every blob the diff opens through the verified cache / store, by digest."""
    opened: list[str] = []
    backend = reg.backend
    assert isinstance(backend, LocalBackend)
    real = backend.open_blob

    def counting(digest: str, size: int) -> Any:
        opened.append(digest)
        return real(digest, size)

    monkeypatch.setattr(backend, "open_blob", counting)
    return opened


def test_a_fine_tune_of_one_block_reports_that_block_and_reads_only_its_shards(
        reg: registry.Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    base, tuned = block_lm(), _tuned()
    va = reg.push(base, "lm", shard_size=SHARD)
    vb = reg.push(tuned, "lm", shard_size=SHARD)
    files_a = {f["digest"]: f for f in va.metadata["files"]}
    files_b = {f["digest"]: f for f in vb.metadata["files"]}
    shared = files_a.keys() & files_b.keys()
    assert shared and len(files_b) > len(shared)  # a shard changed, others reused

    opened = _count_opens(reg, monkeypatch)
    found = reg.diff(va.ref, vb.ref)
    assert not set(opened) & shared  # not one byte of an unchanged shard
    assert set(opened) == (files_a.keys() | files_b.keys()) - shared

    sa, sb = base.state_dict(), tuned.state_dict()
    expected = sorted(k for k in sa if not torch.equal(sa[k], sb[k]) and k != "lm_head.weight")
    assert sorted(c.key for c in found.changed) == expected
    assert all(k.startswith("layers.2.") for k in expected)
    assert {m.module for m in found.modules} == {"layers.2.attn", "layers.2.mlp"}
    for change in found.changed:
        a, b = sa[change.key], sb[change.key]
        assert change.relative_l2 == pytest.approx(float((b - a).norm() / a.norm()), rel=1e-5)
        assert change.max_abs == pytest.approx(float((b - a).abs().max()), rel=1e-6)
        assert change.fraction_changed == pytest.approx(float((a != b).float().mean()))
    attn = [m for m in found.modules if m.module == "layers.2.attn"][0]
    w, bias = "layers.2.attn.weight", "layers.2.attn.bias"
    delta = torch.cat([(sb[w] - sa[w]).flatten(), (sb[bias] - sa[bias]).flatten()])
    assert attn.relative_l2 == pytest.approx(
        float(delta.norm() / torch.cat([sa[w].flatten(), sa[bias].flatten()]).norm()), rel=1e-5)
    assert found.added == found.removed == [] and found.reshaped == []
    assert found.bytes_shared == sum(files_a[d]["size"] for d in shared)
    assert found.unchanged == len(va.metadata["tensors"]) - len(expected)

    opened.clear()
    same = reg.diff(va.ref, va.ref)
    assert same.changed == [] and opened == []  # every shard shared: nothing read


def test_added_removed_reshaped_and_a_dtype_cast_sibling(reg: registry.Registry) -> None:
    small = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    grown = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 3),
                                torch.nn.Linear(3, 1))
    grown[0].load_state_dict(small[0].state_dict())
    va, vb = reg.push(small, "m"), reg.push(grown, "m")
    found = reg.diff(va.ref, vb.ref)
    assert found.added == ["2.bias", "2.weight"] and found.removed == []
    assert [c.key for c in found.reshaped] == ["1.bias", "1.weight"]
    assert found.reshaped[0].relative_l2 is None

    half = reg.push(small.to(torch.bfloat16), "m-bf16")  # Module.to casts in place
    cast = reg.diff(va.ref, half.ref)
    w = small[0].weight.detach()
    assert {c.key for c in cast.reshaped} == {"0.weight", "0.bias", "1.weight", "1.bias"}
    one = [c for c in cast.changed if c.key == "0.weight"][0]
    original = reg.pull_state_dict(va.ref, dtype="float32")["0.weight"]
    rounded = w.to(torch.float32)
    assert one.dtype == ("float32", "bfloat16")
    expected = (rounded - original).norm() / original.norm()
    assert one.relative_l2 == pytest.approx(float(expected), abs=1e-7)


def test_an_adapter_against_its_base_reports_the_effective_delta(
        reg: registry.Registry) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
    base = reg.push(gpt, "gpt")
    peft_model = get_peft_model(gpt, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    adapter = reg.push(peft_model, base="gpt:v1")
    found = reg.diff(base.ref, adapter.ref)
    assert found.mode == "adapter"
    assert [m.module for m in found.modules] == ["transformer.h.0.attn.c_attn",
                                                 "transformer.h.1.attn.c_attn"]
    layer = peft_model.base_model.model.transformer.h[0].attn.c_attn
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).T * (8 / 4)
    weight = layer.base_layer.weight
    change = [c for c in found.changed if c.key == "transformer.h.0.attn.c_attn.weight"][0]
    assert change.relative_l2 == pytest.approx(float(delta.norm() / weight.norm()), rel=1e-4)
    assert change.max_abs == pytest.approx(float(delta.abs().max()), rel=1e-4)


def test_cli_diff_json_and_table(home: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    env = clean_env(home)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    sd = {"x.weight": torch.ones(3, 3), "y.weight": torch.ones(2)}
    save_file(sd, str(a))
    save_file({**sd, "x.weight": torch.full((3, 3), 1.5)}, str(b))
    run_cli("push", "m", str(a), env=env, check=True)
    run_cli("push", "m", str(b), env=env, check=True)
    out = json.loads(run_cli("diff", "m:v1", "m:v2", "--json", env=env, check=True).stdout)
    assert [c["key"] for c in out["changed"]] == ["x.weight"]
    assert out["changed"][0]["relative_l2"] == pytest.approx(0.5)
    assert out["changed"][0]["fraction_changed"] == 1.0
    text = run_cli("diff", "m:v1", "m:v2", "--top", "1", env=env, check=True).stdout
    assert "x.weight" in text and "1 changed, 1 unchanged" in text
    missing = run_cli("diff", "m:v1", "m:v9", env=env)
    assert missing.returncode == 3 and "m:v9" in missing.stderr


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_a_float_version_against_its_int8_sibling_compares_dequantized_float32(
        reg: registry.Registry) -> None:
    quantization = pytest.importorskip("torchao.quantization")

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 8))

    plain = reg.push(model(), "f")
    quantized = model()
    quantization.quantize_(quantized, quantization.Int8WeightOnlyConfig())
    q = reg.push(quantized, "q")
    found = reg.diff(plain.ref, q.ref)
    assert found.mode == "dequantized"
    assert {c.key for c in found.changed} == {"0.weight", "2.weight"}  # biases stay float
    a = reg.pull_state_dict(plain.ref)["0.weight"]
    b = reg.pull_state_dict(q.ref, dtype="float32")["0.weight"]
    change = [c for c in found.changed if c.key == "0.weight"][0]
    assert change.dtype == ("float32", "float32")
    assert 0 < change.relative_l2 < 0.02  # int8 rounding, not a different model
    assert change.relative_l2 == pytest.approx(float((b - a).norm() / a.norm()), rel=1e-5)


def test_one_element_changed_equal_nan_kept_and_modules_roll_up_their_changed_tensors(
        reg: registry.Registry) -> None:
    """A change in a tensor's last element alone is found; a NaN stored alike in both is not a
    change; a bfloat16 tensor is compared as stored; a module's norm is its changed tensors'."""
    torch.manual_seed(0)
    weight = torch.randn(600, 700)  # over one 128 Ki-element chunk
    weight[0, 0] = float("nan")
    base = {"layer.weight": weight, "layer.bias": torch.randn(600),
            "half.weight": torch.randn(40, 30).to(torch.bfloat16),
            "half.bias": torch.randn(40).to(torch.bfloat16)}
    tuned = {k: v.clone() for k, v in base.items()}
    tuned["layer.weight"][-1, -1] += 0.25
    tuned["half.weight"][5] *= 2
    va, vb = reg.push(base, "n"), reg.push(tuned, "n")
    found = reg.diff(va.ref, vb.ref)
    assert [c.key for c in found.changed] == ["half.weight", "layer.weight"]
    assert found.unchanged == 2  # the biases: equal bytes in a shard that was read
    layer = found.changed[1]
    assert layer.fraction_changed == 1 / weight.numel()
    assert layer.max_abs == pytest.approx(0.25, rel=1e-6)
    assert layer.relative_l2 is not None and math.isnan(layer.relative_l2)  # ||a|| holds the NaN
    half = found.changed[0]
    a, b = base["half.weight"].double(), tuned["half.weight"].double()
    assert half.dtype == ("bfloat16", "bfloat16")
    assert half.relative_l2 == pytest.approx(float((b - a).norm() / a.norm()), rel=1e-5)
    assert half.fraction_changed == pytest.approx(float((a != b).double().mean()))
    modules = {m.module: m for m in found.modules}
    assert (modules["layer"].tensors, modules["layer"].changed) == (2, 1)
    assert (modules["half"].tensors, modules["half"].changed) == (2, 1)
    assert modules["half"].relative_l2 == pytest.approx(half.relative_l2)  # not over its bias
    assert json.loads(json.dumps(found.to_dict()))["changed"][1]["relative_l2"] is None
