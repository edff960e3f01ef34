"""Hugging Face transformers and timm models pushed as modules are pulled WITHOUT model= (issue
11): the push records the class and config (or timm's factory and shape kwargs), the pull rebuilds
it on meta and fills it. Tiny models built from configs; nothing is downloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import registry
from registry import NormalizationError, RefError, Registry
from registry.model.architectures import fit_name

VOCAB = 100


def _gpt2() -> nn.Module:
    import transformers as tf

    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB,
                                            bos_token_id=0, eos_token_id=0))


def _bert() -> nn.Module:
    import transformers as tf

    return tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                      intermediate_size=64, vocab_size=VOCAB))


def _llama() -> nn.Module:
    import transformers as tf

    return tf.LlamaForCausalLM(tf.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=VOCAB, bos_token_id=0, eos_token_id=0))


def _t5() -> nn.Module:
    import transformers as tf

    return tf.T5ForConditionalGeneration(tf.T5Config(
        num_layers=2, d_model=32, d_ff=64, num_heads=2, d_kv=16, vocab_size=VOCAB))


def _resnet() -> nn.Module:
    import timm

    return timm.create_model("resnet18", num_classes=10)


def _vit() -> nn.Module:
    import timm

    return timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=10, in_chans=1)


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))


def _run(name: str, model: nn.Module) -> Any:
    ids = _ids()
    if name in ("gpt2", "llama"):
        return model(ids, use_cache=False).logits
    if name == "bert":
        return model(ids).last_hidden_state
    if name == "t5":
        return model(input_ids=ids, decoder_input_ids=ids[:, :3], use_cache=False).logits
    return model(torch.randn(2, 1 if name == "vit" else 3, 32, 32,
                             generator=torch.Generator().manual_seed(2)))


# name -> (builder, recorded class or factory, the name a push without one derives, tied groups)
CASES: dict[str, tuple[Callable[[], nn.Module], str, str, list[set[str]]]] = {
    "gpt2": (_gpt2, "transformers:GPT2LMHeadModel", "gpt2",
             [{"transformer.wte.weight", "lm_head.weight"}]),
    "bert": (_bert, "transformers:BertModel", "bert", []),
    "llama": (_llama, "transformers:LlamaForCausalLM", "llama", []),
    "t5": (_t5, "transformers:T5ForConditionalGeneration", "t5",
           [{"shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
             "lm_head.weight"}]),
    "resnet": (_resnet, "timm:create_model", "resnet18", []),
    "vit": (_vit, "timm:create_model", "vit_tiny_patch16_224", []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pushed_module_is_pulled_without_model(case: str, reg: Registry) -> None:
    build, recorded, derived, tied = CASES[case]
    torch.manual_seed(0)
    model = build().eval()
    version = reg.push(model)  # no name: derived from what was pushed
    assert version.ref == f"{derived}:v1"
    arch = version.metadata["architecture"]
    if recorded.startswith("transformers:"):
        assert arch["kind"] == "transformers" and arch["class"] == recorded
        assert arch["config"] == json.loads(model.config.to_json_string(use_diff=False))
    else:
        assert arch["factory"] == recorded and "pretrained" not in arch["factory_kwargs"]

    pulled = reg.pull(version.ref, device="cpu")
    assert type(pulled) is type(model) and not pulled.training
    if recorded.startswith("transformers:"):
        assert pulled.config.to_dict() == model.config.to_dict()
    expected, got = model.state_dict(), pulled.state_dict()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    for group in tied:
        assert len({got[k].data_ptr() for k in group}) == 1, f"{group} not tied after pull"
    with torch.no_grad():
        torch.testing.assert_close(_run(case, pulled), _run(case, model))


def test_weights_the_pushed_model_held_apart_stay_apart(reg: Registry) -> None:
    """GPT-2's config ties lm_head to the embeddings; a model whose lm_head was given a weight
    of its own (and trained apart) comes back with that weight, not the embeddings' copy."""
    torch.manual_seed(0)
    model = _gpt2().eval()
    model.lm_head.weight = nn.Parameter(torch.randn_like(model.lm_head.weight))
    version = reg.push(model, "untied")
    assert version.metadata["source"]["tied"] == {}
    pulled = reg.pull(version.ref, device="cpu")
    assert torch.equal(pulled.lm_head.weight, model.lm_head.weight)
    assert torch.equal(pulled.transformer.wte.weight, model.transformer.wte.weight)
    assert pulled.lm_head.weight.data_ptr() != pulled.transformer.wte.weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(_run("gpt2", pulled), _run("gpt2", model))


def test_timm_shape_kwargs_are_recorded(reg: Registry) -> None:
    version = reg.push(_vit(), "vit")
    assert version.metadata["architecture"]["factory_kwargs"] == {
        "model_name": "vit_tiny_patch16_224", "num_classes": 10, "in_chans": 1,
        "img_size": [32, 32]}


def test_generation_config_travels(reg: Registry) -> None:
    import transformers as tf

    model = _gpt2()
    model.generation_config = tf.GenerationConfig(max_new_tokens=5, do_sample=True, top_k=3)
    version = reg.push(model, "gen")
    assert version.metadata["architecture"]["generation_config"]["top_k"] == 3
    pulled = reg.pull("gen", device="cpu")
    assert pulled.generation_config.top_k == 3 and pulled.generation_config.max_new_tokens == 5
    out = pulled.generate(_ids()[:1], max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 9)


def test_a_default_generation_config_is_not_recorded(reg: Registry) -> None:
    assert "generation_config" not in reg.push(_gpt2(), "g").metadata["architecture"]


def test_a_subclass_of_the_users_records_no_config(reg: Registry) -> None:
    import transformers as tf

    class Mine(tf.BertModel):
        pass

    model = Mine(_bert().config)
    arch = reg.push(model, "mine").metadata["architecture"]
    assert "kind" not in arch and "config" not in arch
    with pytest.raises(registry.ArchitectureUnknownError, match="model="):
        reg.pull("mine", device="cpu")
    pulled = reg.pull("mine", device="cpu", model=lambda: Mine(model.config))
    assert torch.equal(pulled.pooler.dense.weight, model.pooler.dense.weight)


# -- names ---------------------------------------------------------------------------------------

def test_name_from_tags_then_derived_then_refused(reg: Registry) -> None:
    from tests.helpers import trained_mlp

    assert reg.push(trained_mlp(), tags={"name": "x"}).ref == "x:v1"
    assert reg.push(trained_mlp(), tags={"name": "My Model / v2!"}).ref == "my-model-v2:v1"
    assert reg.push(trained_mlp()).ref == "mlp:v1"
    assert registry.push.__defaults__ == (None,)  # the module-level verb takes no name either
    with pytest.raises(RefError, match="pass one"):
        reg.push(trained_mlp().state_dict())
    state = trained_mlp().state_dict()
    assert reg.push(state, factory="tests.helpers:make_mlp").ref == "make_mlp:v1"


def test_hf_name_or_path_names_the_version(reg: Registry) -> None:
    model = _bert()
    model.config._name_or_path = "google-bert/Bert_Base-Uncased"
    assert reg.push(model).ref == "bert_base-uncased:v1"


@pytest.mark.parametrize(("text", "fitted"), [
    ("LlamaForCausalLM", "llamaforcausallm"), ("  __x__  ", "x"), ("a b\tc", "a-b-c"),
    ("ÄÖÜ", None), ("---", None), ("v" * 300, "v" * 128), ("x:v3", "x-v3")])
def test_fit_name(text: str, fitted: str | None) -> None:
    assert fit_name(text) == fitted


# -- quantized modules -----------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_a_dynamically_quantized_module_is_refused_with_the_way_out(reg: Registry) -> None:
    float_model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    quantized = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear},
                                                       dtype=torch.qint8)
    # The module is stored (tests/integration/test_quantized.py); its bare state dict, whose
    # packed entries say nothing of the modules they came from, is refused.
    with pytest.raises(NormalizationError, match="quantized modules are not stored yet") \
            as info:
        reg.push(quantized.state_dict(), "q")
    assert "before torch.ao.quantization.quantize_dynamic" in str(info.value)
    assert reg.list_models() == []
    reg.push(float_model, "q")  # what the message says to do works
    torch.ao.quantization.quantize_dynamic(reg.pull("q", device="cpu", model=float_model),
                                           {nn.Linear}, dtype=torch.qint8)


# -- transformers and timm stay optional -----------------------------------------------------------

_BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("transformers", "timm"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
"""


def _blocked(code: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REGISTRY_HOME": str(home)}
    return subprocess.run([sys.executable, "-c", _BLOCK + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_plain_modules_never_import_transformers_or_timm(home: Path) -> None:
    done = _blocked("""
        import sys, torch, registry
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        version = registry.push(model, "plain")
        registry.push(model.state_dict(), "plain")
        registry.pull("plain:v1", device="cpu", model=torch.nn.Sequential(torch.nn.Linear(4, 4)))
        loaded = [m for m in sys.modules if m.split(".")[0] in ("transformers", "timm")]
        assert not loaded, loaded
        print("ok", version.ref)
    """, home)
    assert done.returncode == 0 and "ok plain:v1" in done.stdout, done.stderr[-2000:]


def test_pulling_an_hf_version_without_transformers_says_what_to_install(home: Path) -> None:
    reg_here = Registry(home=home)
    try:
        reg_here.push(_bert(), "bert")
        reg_here.push(_resnet(), "resnet")
    finally:
        reg_here.close()
    done = _blocked("""
        import registry
        for ref in ("bert", "resnet"):
            try:
                registry.pull(ref, device="cpu")
            except registry.RegistryError as exc:
                print(type(exc).__name__, exc)
        print(len(registry.pull_state_dict("bert")))
    """, home)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ArchitectureUnknownError") and "torch-registry[hf]" in lines[0]
    assert lines[1].startswith("ArchitectureUnknownError") and "torch-registry[hf]" in lines[1]
    assert int(lines[2]) > 0


def test_an_explicit_factory_wins_over_the_recorded_architecture(reg: Registry) -> None:
    arch = reg.push(_resnet(), "r", factory="timm:create_model",
                    factory_kwargs={"model_name": "resnet18", "num_classes": 10}
                    ).metadata["architecture"]
    assert arch["factory_kwargs"] == {"model_name": "resnet18", "num_classes": 10}
    bert = reg.push(_bert(), "b", factory="transformers:BertModel")
    assert "kind" not in bert.metadata["architecture"]


def test_show_names_the_class_and_model_type(reg: Registry) -> None:
    from registry.display import version_table

    table = version_table(reg.push(_bert(), "b"))
    assert "transformers:BertModel (from its config, model_type=bert)" in table


@pytest.mark.slow  # starting the server takes ~10 s
def test_through_a_server_a_nameless_push_pulls_without_model(tmp_path: Path) -> None:
    from tests.integration.serving import registry_server

    with registry_server(tmp_path / "server-home", tmp_path) as service:
        remote = Registry(service.url, home=tmp_path / "client")
        try:
            model = _t5().eval()
            assert remote.push(model).ref == "t5:v1"
            pulled = remote.pull("t5", device="cpu")
            assert pulled.lm_head.weight.data_ptr() == pulled.shared.weight.data_ptr()
            with torch.no_grad():
                torch.testing.assert_close(_run("t5", pulled), _run("t5", model))
        finally:
            remote.close()


def test_a_config_that_json_cannot_hold_is_not_recorded(reg: Registry,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    model = _bert()
    model.config.layer_norm_eps = float("inf")  # a manifest holds plain JSON only
    version = reg.push(model, "b")
    assert "config" not in version.metadata["architecture"]
    assert "pull it with model=" in caplog.text
    pulled = reg.pull("b", device="cpu", model=lambda: type(model)(model.config))
    assert torch.equal(pulled.pooler.dense.weight, model.pooler.dense.weight)
