"""An adapter's LoRA layers built by PEFT once per kind and copied for the rest
(registry/formats/peft/copies.py): the copies are what PEFT builds, share nothing, and PEFT
builds every layer wherever a copy could differ."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from registry import Registry
from registry.formats.peft import copies as loracopies
from registry.model.metaparams import empty_parameters

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft.tuners.lora.layer import Linear as LoraLinear  # noqa: E402
from peft.tuners.lora.model import LoraModel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

IDS = torch.tensor([[1, 5, 9, 42, 7, 3]])


def _llama(seed: int = 0, layers: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=100, bos_token_id=0, eos_token_id=0)).eval()


def _gpt2(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0,
        eos_token_id=0)).eval()


CONFIGS: dict[str, tuple[Any, dict[str, Any]]] = {
    "q-v": (_llama, {"target_modules": ["q_proj", "v_proj"]}),
    "all-linear, dropout, rslora, patterns": (_llama, {
        "target_modules": "all-linear", "lora_dropout": 0.1, "use_rslora": True,
        "rank_pattern": {"v_proj": 2}, "alpha_pattern": {"o_proj": 16}}),
    "regex, some layers": (_llama, {"target_modules": r".*\.(0|2)\.mlp\.(up|down)_proj"}),
    "exclude": (_llama, {"target_modules": ["q_proj", "k_proj"],
                         "exclude_modules": ["model.layers.1.self_attn.k_proj"]}),
    "dora (built by PEFT)": (_llama, {"target_modules": ["q_proj", "v_proj"], "use_dora": True}),
    "lora bias (built by PEFT)": (_llama, {"target_modules": ["q_proj"], "lora_bias": True}),
    "gpt2 Conv1D (built by PEFT)": (_gpt2, {"target_modules": ["c_attn", "c_proj"],
                                            "fan_in_fan_out": True}),
}


@contextlib.contextmanager
def _building() -> Iterator[list[str]]:
    """The target names of the LoRA Linears PEFT builds (rather than copied) in the block."""
    built: list[str] = []
    original = LoraLinear.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(kwargs.get("target_name"))
        original(self, *args, **kwargs)

    LoraLinear.__init__ = counted  # type: ignore[method-assign]
    try:
        yield built
    finally:
        LoraLinear.__init__ = original  # type: ignore[method-assign]


def _inject(base: nn.Module, config: Any, *, copy: bool) -> tuple[Any, int]:
    """``get_peft_model`` as an adapter's pull calls it, and how many LoRA Linears PEFT built."""
    with _building() as built, empty_parameters(), \
            loracopies.copying() if copy else contextlib.nullcontext():
        model = peft.get_peft_model(base, config, low_cpu_mem_usage=True,
                                    autocast_adapter_dtype=False)
    return model, len(built)


def _described(model: nn.Module) -> list[Any]:
    """Every module's path and type, every attribute that is not a module or parameter, every
    parameter's shape, dtype, device and requires_grad, and the adapter's config."""
    out: list[Any] = []
    for name, module in model.named_modules():
        state = {key: value for key, value in vars(module).items()
                 if key not in ("_modules", "_parameters", "base_layer")}
        params = [(key, None if p is None else (tuple(p.shape), p.dtype, p.device,
                                                 p.requires_grad, type(p)))
                  for key, p in module._parameters.items()]
        # An object without its own repr (DoRA's variant) shows as its type alone.
        out.append((name, type(module), re.sub(r" at 0x[0-9a-f]+", "", repr(state)), params))
    out.append(model.peft_config["default"].to_dict())
    out.append(list(model.base_model.targeted_module_names))
    out.append(model.active_adapters)
    return out


def _filled(model: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    lora = {name: nn.Parameter(torch.randn(p.shape, generator=gen) * 0.1,
                               requires_grad=p.requires_grad)
            for name, p in model.named_parameters() if p.is_meta}
    for name, value in lora.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._parameters[leaf] = value
    return model.eval()  # as a pull hands it back: dropout off


@pytest.mark.parametrize("name", list(CONFIGS))
def test_copied_layers_are_what_peft_builds(name: str) -> None:
    make, fields = CONFIGS[name]
    config = peft.LoraConfig(r=4, init_lora_weights=False, **fields)
    want, built_alone = _inject(make(), config, copy=False)
    got, built = _inject(make(), peft.LoraConfig(r=4, init_lora_weights=False, **fields),
                         copy=True)
    assert _described(got) == _described(want)
    layers = [m for m in got.modules() if isinstance(m, LoraLinear)]
    if "built by PEFT" in name:
        assert built == built_alone == len(layers)
    else:
        # One layer built by PEFT for each kind (shape, rank, alpha), the others copied.
        kinds = {(m.in_features, m.out_features, m.r["default"], m.lora_alpha["default"])
                 for m in layers}
        assert built == len(kinds) < built_alone == len(layers)
    with torch.no_grad():
        torch.testing.assert_close(_filled(got, 3)(IDS).logits, _filled(want, 3)(IDS).logits,
                                   rtol=0, atol=0)


def _shared(model: nn.Module) -> list[tuple[str, str]]:
    """The containers and parameters two LoRA layers of ``model`` hold in common."""
    first, second = (model.base_model.model.model.layers[i].self_attn.q_proj for i in (0, 1))
    assert first.base_layer is not second.base_layer
    out = []
    for (name, a), (_, b) in zip(first.named_modules(), second.named_modules(), strict=True):
        if a is first.base_layer:
            continue
        if a is b:
            out.append((name, "<module>"))
        for key, value in vars(a).items():
            if isinstance(value, (dict, list, set)) and value is vars(b)[key]:
                out.append((name, key))
        out += [(name, key) for key, p in a._parameters.items()
                if p is not None and p is b._parameters[key]]
    return out


def test_copies_share_nothing_peft_does_not_share() -> None:
    config = peft.LoraConfig(r=4, target_modules=["q_proj"])
    model, _ = _inject(_llama(), config, copy=True)
    # PEFT's set_adapter gives every layer one list of active adapters; nothing else is shared.
    want = _shared(_inject(_llama(), peft.LoraConfig(r=4, target_modules=["q_proj"]),
                           copy=False)[0])
    assert _shared(model) == want == [("", "_active_adapter")]
    first, second = (model.base_model.model.model.layers[i].self_attn.q_proj for i in (0, 1))
    assert first.kwargs["target_name"] == "model.layers.0.self_attn.q_proj"
    assert second.kwargs["target_name"] == "model.layers.1.self_attn.q_proj"
    first.r["default"] = 99
    first.kwargs["device_map"][""] = "elsewhere"
    first.lora_A["default"].register_forward_hook(lambda *args: None)
    assert second.r["default"] == 4 and second.kwargs["device_map"][""] != "elsewhere"
    assert not second.lora_A["default"]._forward_hooks


def test_peft_builds_every_layer_a_registration_hook_must_see() -> None:
    seen: list[str] = []
    handle = nn.modules.module.register_module_module_registration_hook(
        lambda module, name, sub: seen.append(name))
    try:
        _, built = _inject(_llama(), peft.LoraConfig(r=4, target_modules=["q_proj"]),
                           copy=True)
    finally:
        handle.remove()
    assert built == 3 and seen.count("base_layer") == 3


def test_only_the_thread_in_the_block_copies() -> None:
    original = LoraModel.__dict__["_create_new_module"]
    counts: dict[str, int] = {}

    def other() -> None:
        counts["other"] = _inject(_llama(), peft.LoraConfig(r=4, target_modules=["q_proj"]),
                                  copy=False)[1]

    with loracopies.copying():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert counts["other"] == 3
    assert LoraModel.__dict__["_create_new_module"] is not original  # a new staticmethod...
    assert LoraModel.__dict__["_create_new_module"].__func__ is original.__func__  # ...of it


def test_an_adapter_over_a_float_llama_round_trips_with_copied_layers(reg: Registry) -> None:
    base_v = reg.push(_llama(), "llama-tiny")
    torch.manual_seed(1)
    tuned = peft.get_peft_model(_llama(), peft.LoraConfig(
        r=4, target_modules="all-linear", init_lora_weights=False)).eval()
    with torch.no_grad():
        want = tuned(IDS).logits
    mv = reg.push(tuned, "llama-tiny-chat", base=f"llama-tiny:v{base_v.version}")
    with _building() as built:
        pulled = reg.pull(mv.ref, device="cpu")
    layers = [m for m in pulled.modules() if isinstance(m, LoraLinear)]
    assert len(layers) == 21 and len(built) == 4  # by shape: q=o, k=v, gate=up, down
    assert not any(p.is_meta for p in pulled.parameters())
    with torch.no_grad():
        torch.testing.assert_close(pulled(IDS).logits, want)
    assert peft.get_peft_model_state_dict(pulled).keys() == \
        peft.get_peft_model_state_dict(tuned).keys()
