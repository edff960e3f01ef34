"""PEFT's attach of an adapter recorded once and replayed on later bases
(registry/formats/peft/replay.py): a replay is what PEFT gives, two replays share nothing, and PEFT
attaches wherever a replay could differ."""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from registry import Registry
from registry.formats.peft import replay as peftreplay

from .test_loracopies import CONFIGS, IDS, _filled, _gpt2, _inject, _llama

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class _MLP(nn.Module):
    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(_Block() for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def _mlp(seed: int = 0, blocks: int = 2) -> nn.Module:
    torch.manual_seed(seed)
    return _MLP(blocks).eval()


def _int8_llama(seed: int = 0) -> nn.Module:
    """A Llama quantized by torchao (int8 weight-only): PEFT's LoRA layers over its Linears
    are its torchao kind, holding the quantized base layer."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = _llama(seed)
    quantize_(model, Int8WeightOnlyConfig())
    return model


REPLAYED: dict[str, tuple[Callable[..., nn.Module], dict[str, Any]]] = {
    **{name: value for name, value in CONFIGS.items() if "dora" not in name},
    "gpt2 causal LM": (_gpt2, {"target_modules": ["c_attn"], "fan_in_fan_out": True,
                               "task_type": "CAUSAL_LM"}),
    "llama causal LM, all-linear": (_llama, {"target_modules": "all-linear",
                                             "task_type": "CAUSAL_LM"}),
    "plain module": (_mlp, {"target_modules": ["up", "down"]}),
    "int8 (torchao) base": (_int8_llama, {"target_modules": ["q_proj", "v_proj"]}),
}


def _attaching(fields: dict[str, Any]) -> tuple[Callable[[nn.Module], nn.Module], list[int]]:
    """An attach as an adapter's pull makes it, and a list that counts PEFT's own attaches."""
    calls: list[int] = []

    def attach(base: nn.Module) -> nn.Module:
        calls.append(1)
        return _inject(base, peft.LoraConfig(r=4, init_lora_weights=False, **fields),
                       copy=True)[0]

    return attach, calls


def _aliases(model: nn.Module) -> list[list[str]]:
    """Every container, parameter and object (not a plain value) reachable from ``model``'s
    modules that sits at more than one attribute path, as the sorted groups of its paths: what
    PEFT shares between its objects, and what a replay must share the same way."""
    where: dict[int, list[str]] = {}
    keep: list[Any] = []

    def visit(value: Any, path: str) -> None:
        if isinstance(value, (type(None), bool, int, float, str, torch.dtype, torch.device,
                              type)) or callable(value) and not isinstance(value, nn.Module):
            return
        seen = id(value) in where
        where.setdefault(id(value), []).append(path)
        keep.append(value)
        if seen:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                visit(item, f"{path}[{key!r}]")
        elif isinstance(value, (list, tuple, set)):
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]")
        elif hasattr(value, "__dict__") and not isinstance(value, torch.Tensor):
            for key, item in vars(value).items():
                visit(item, f"{path}.{key}")

    visit(model, "model")
    return sorted(sorted(paths) for paths in where.values() if len(paths) > 1)


def _state(model: nn.Module) -> list[Any]:
    """Every module of ``model`` (base and PEFT's): its path, type and every attribute, modules
    named by path, tensors by shape, dtype, device, requires_grad and type, objects by their
    attributes, bound methods by their object and function, sets sorted (a set's order is not
    part of it: a replay's sets hold what PEFT's hold, in the order their hash table gives)."""
    paths = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}

    def canonical(value: Any) -> Any:
        if isinstance(value, nn.Module):
            return ("module", paths.get(id(value), "elsewhere"))
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.dtype, value.device,
                    value.requires_grad, type(value))
        if isinstance(value, (set, frozenset)):
            return (type(value), sorted(repr(v) for v in value))
        if isinstance(value, dict):
            return (type(value), [(k, canonical(v)) for k, v in value.items()])
        if isinstance(value, (list, tuple)):
            return (type(value), [canonical(v) for v in value])
        if isinstance(value, types.MethodType):
            return ("method", canonical(value.__self__), canonical(value.__func__))
        if isinstance(value, functools.partial):  # torchao's extra_repr on a quantized Linear
            return ("partial", value.func, canonical(value.args), canonical(value.keywords))
        if isinstance(value, (type(None), bool, int, float, str, torch.dtype, torch.device)):
            return value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return (type(value), canonical(vars(value)))
        return (type(value), re.sub(r" at 0x[0-9a-f]+", "", repr(value)))

    return [(name, type(m), canonical(vars(m)))
            for name, m in model.named_modules(remove_duplicate=False)]


def _frozen(model: nn.Module) -> list[tuple[str, bool]]:
    return [(name, p.requires_grad) for name, p in model.named_parameters()]


@pytest.mark.parametrize("name", list(REPLAYED))
def test_a_replay_is_what_peft_gives(name: str) -> None:
    make, fields = REPLAYED[name]
    if make is _int8_llama:
        pytest.importorskip("torchao")
    attach, calls = _attaching(fields)
    first = peftreplay.attached(make(), "key", attach)  # PEFT's alone
    peftreplay.attached(make(), "key", attach)  # PEFT's, recorded
    got = peftreplay.attached(make(), "key", attach)
    assert len(calls) == 2  # the third is a replay
    want = attach(make())
    assert got is not first and got.base_model.model is not first.base_model.model
    assert _state(got) == _state(want)
    assert _aliases(got) == _aliases(want)
    assert _frozen(got) == _frozen(want)
    assert got.base_model.model.peft_config is got.peft_config  # PEFT sets it on the base too
    if hasattr(want, "base_model_prepare_inputs_for_generation"):
        bound = got.base_model_prepare_inputs_for_generation
        assert bound.__self__ is got.base_model.model
        assert bound.__func__ is want.base_model_prepare_inputs_for_generation.__func__
    inputs = torch.randn(3, 8) if make is _mlp else IDS
    with torch.no_grad():
        out, expected = _filled(got, 3)(inputs), _filled(want, 3)(inputs)
        if make is not _mlp:
            out, expected = out.logits, expected.logits
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    if "causal LM" in name:
        with torch.no_grad():
            generated = got.generate(input_ids=IDS, max_new_tokens=3, do_sample=False)
        assert torch.equal(generated, want.generate(input_ids=IDS, max_new_tokens=3,
                                                    do_sample=False))


def _objects(model: nn.Module) -> dict[int, Any]:
    """Every mutable object reachable from ``model`` (modules, containers, parameters,
    configs) by identity."""
    found: dict[int, Any] = {}

    def visit(value: Any) -> None:
        if isinstance(value, (type(None), bool, int, float, str, bytes, torch.dtype,
                              torch.device, type, frozenset, tuple)) or id(value) in found:
            if isinstance(value, tuple):
                for item in value:
                    visit(item)
            return
        if callable(value) and not isinstance(value, nn.Module):
            return
        found[id(value)] = value
        if isinstance(value, dict):
            for item in value.values():
                visit(item)
        elif isinstance(value, (list, set)):
            for item in value:
                visit(item)
        elif hasattr(value, "__dict__") and not isinstance(value, torch.Tensor):
            for item in vars(value).values():
                visit(item)

    visit(model)
    return found


def test_two_replays_share_nothing() -> None:
    attach, calls = _attaching({"target_modules": ["q_proj", "v_proj"],
                                "task_type": "CAUSAL_LM"})
    for _ in range(2):
        peftreplay.attached(_llama(), "key", attach)
    bases = _llama(), _llama()
    before = _objects(bases[0]).keys() | _objects(bases[1]).keys()
    one, two = (peftreplay.attached(base, "key", attach) for base in bases)
    assert len(calls) == 2
    # Objects new in each (PEFT's layers, wrappers, config and their containers): none common.
    new_one, new_two = (_objects(model).keys() - before for model in (one, two))
    assert len(new_one) > 100 and not new_one & new_two
    one.peft_config["default"].r = 99
    one.peft_config["default"].target_modules.add("k_proj")
    one.base_model.model.model.layers[0].self_attn.q_proj.r["default"] = 99
    one.set_adapter("default")
    assert two.peft_config["default"].r == 4
    assert two.peft_config["default"].target_modules == {"q_proj", "v_proj"}
    assert two.base_model.model.model.layers[0].self_attn.q_proj.r["default"] == 4


def test_peft_attaches_a_base_unlike_the_recorded_one() -> None:
    attach, calls = _attaching({"target_modules": ["q_proj"]})

    def recorded(key: str, base: Callable[[], nn.Module]) -> None:
        for _ in range(2):
            peftreplay.attached(base(), key, attach)
        peftreplay.attached(base(), key, attach)  # replayed
        assert len(calls) == 2
        calls.clear()

    recorded("layers", lambda: _llama(layers=2))
    other = peftreplay.attached(_llama(layers=3), "layers", attach)  # one layer more
    assert len(calls) == 1
    assert _state(other) == _state(attach(_llama(layers=3)))
    calls.clear()
    # The targets' weights are checked too: another dtype is another base.
    recorded("dtypes", lambda: _llama(layers=3))
    peftreplay.attached(_llama(layers=3).to(torch.bfloat16), "dtypes", attach)
    assert len(calls) == 1
    calls.clear()
    # And a base with a hook (PEFT may move it, or wrap around it): PEFT attaches it.
    recorded("hooks", lambda: _llama(layers=3))
    hooked = _llama(layers=3)
    hooked.model.norm.register_forward_pre_hook(lambda *args: None)
    peftreplay.attached(hooked, "hooks", attach)
    assert len(calls) == 1


def test_peft_attaches_where_a_registration_hook_must_see_every_module() -> None:
    attach, calls = _attaching({"target_modules": ["q_proj"]})
    for _ in range(2):
        peftreplay.attached(_llama(), "key", attach)
    seen: list[str] = []
    handle = nn.modules.module.register_module_module_registration_hook(
        lambda module, name, sub: seen.append(name))
    try:
        peftreplay.attached(_llama(), "key", attach)
    finally:
        handle.remove()
    assert len(calls) == 3 and "base_layer" in seen


def _with(change: Callable[[nn.Module], None],
          attach: Callable[[nn.Module], nn.Module]) -> Callable[[nn.Module], nn.Module]:
    def changed(base: nn.Module) -> nn.Module:
        model = attach(base)
        change(model)
        return model
    return changed


@pytest.mark.parametrize("what", [
    "a hook on the base", "a base attribute replaced", "a config mutated", "a function kept",
    "a tensor kept", "a base parameter replaced", "a base parameter cast",
    "a base parameter marked", "a base module moved", "a base's set kept",
    "a base hooked"])
def test_peft_attaches_every_time_what_a_recipe_cannot_hold(what: str) -> None:
    """Whatever an attach does beyond what a recipe replays is found when it is recorded, and
    that attach is left to PEFT from then on."""
    attach, calls = _attaching({"target_modules": ["q_proj"], "task_type": "CAUSAL_LM"})

    def root(model: nn.Module) -> nn.Module:
        return model.base_model.model

    changes: dict[str, Callable[[nn.Module], Any]] = {
        "a hook on the base": lambda m: root(m).model.embed_tokens.register_forward_hook(
            lambda *args: None),
        "a base attribute replaced": lambda m: setattr(root(m), "config",
                                                       transformers.LlamaConfig()),
        "a config mutated": lambda m: setattr(root(m).config, "use_cache", False),
        "a function kept": lambda m: setattr(m.base_model, "callback", lambda: None),
        "a tensor kept": lambda m: setattr(m.base_model, "scale", torch.ones(2)),
        "a base parameter replaced": lambda m: root(m).lm_head._parameters.__setitem__(
            "weight", nn.Parameter(torch.zeros(100, 32))),
        "a base parameter cast": lambda m: setattr(root(m).model.norm.weight, "data",
                                                   root(m).model.norm.weight.data.double()),
        "a base parameter marked": lambda m: setattr(root(m).lm_head.weight, "tied", True),
        "a base module moved": lambda m: setattr(root(m).model, "norm_again",
                                                 root(m).model.norm),
        "a base's set kept": lambda m: setattr(m.base_model, "keys",
                                                root(m).model._non_persistent_buffers_set),
    }
    changed = attach if what == "a base hooked" else _with(changes[what], attach)

    def base() -> nn.Module:
        model = _llama()
        if what == "a base hooked":
            model.model.norm.register_forward_pre_hook(lambda *args: None)
        return model

    for _ in range(3):
        peftreplay.attached(base(), "key", changed)
    assert len(calls) == 3


def test_an_adapter_pull_replays_peft_after_the_first(reg: Registry, monkeypatch) -> None:
    """Through the registry: the second pull of an adapter is a replay, and what it gives is
    what the first gave (PEFT's own): the same outputs, the same model."""
    reg.push(_llama(), "llama-tiny")
    torch.manual_seed(1)
    tuned = peft.get_peft_model(_llama(), peft.LoraConfig(
        r=4, target_modules="all-linear", init_lora_weights=False,
        task_type="CAUSAL_LM")).eval()
    mv = reg.push(tuned, "llama-lora", base="llama-tiny:v1")
    with torch.no_grad():
        want = tuned(IDS).logits
    counted = _counting(monkeypatch)
    first = reg.pull(mv.ref, device="cpu")
    reg.pull(mv.ref, device="cpu")  # recorded
    third = reg.pull(mv.ref, device="cpu")
    assert counted == [1, 1]
    assert _state(third) == _state(first)
    assert _aliases(third) == _aliases(first)
    with torch.no_grad():
        torch.testing.assert_close(third(IDS).logits, want, rtol=0, atol=0)
        torch.testing.assert_close(first(IDS).logits, want, rtol=0, atol=0)
    assert not any(m.training for m in third.modules())
    # Another way of pulling it is another key: PEFT attaches it twice more, then replays.
    for _ in range(3):
        reg.pull(mv.ref, device="cpu", dtype="bfloat16")
    assert len(counted) == 4
    # A module given with model= can be anything: PEFT attaches every time.
    for _ in range(3):
        reg.pull(mv.ref, device="cpu", model=_llama(5))
    assert len(counted) == 7


def _counting(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = peft.get_peft_model

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(peft, "get_peft_model", counted)
    return calls
