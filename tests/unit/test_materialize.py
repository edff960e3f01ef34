"""Building modules without weights, and the checks before loading."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from torch import nn

from registry import StateDictMismatchError
from registry.model.materialize import (
    assign_plainly,
    build_module,
    check_fits,
    empty_parameters,
    fill_module,
)
from tests.helpers import MLP


def test_empty_parameters_puts_parameters_on_meta_and_keeps_buffers() -> None:
    with empty_parameters():
        model = MLP()
    assert all(p.is_meta for p in model.parameters())
    assert torch.equal(model.scale, torch.full((3,), 2.0))  # non-persistent buffer kept
    assert not model.bn.running_mean.is_meta
    assert nn.Linear(2, 2).weight.device.type == "cpu", "the patch is gone after the context"


def test_empty_parameters_does_not_touch_other_threads() -> None:
    inside = threading.Event()
    release = threading.Event()
    built: list[nn.Module] = []

    def build_elsewhere() -> None:
        inside.wait()
        built.append(nn.Linear(3, 3))
        release.set()

    worker = threading.Thread(target=build_elsewhere)
    worker.start()
    with empty_parameters():
        inside.set()
        release.wait(timeout=30)
        meta = nn.Linear(3, 3)
    worker.join()
    assert meta.weight.is_meta
    assert built[0].weight.device.type == "cpu" and not built[0].weight.is_meta


def test_nested_contexts() -> None:
    with empty_parameters():
        with empty_parameters():
            a = nn.Linear(1, 1)
        b = nn.Linear(1, 1)
    assert a.weight.is_meta and b.weight.is_meta
    assert not nn.Linear(1, 1).weight.is_meta


def test_check_fits_compares_shapes_from_manifest_specs() -> None:
    model = MLP()
    specs = {k: {"dtype": "float32", "shape": list(v.shape)} for k, v in
             model.state_dict().items()}
    check_fits(model, specs, "m:v1")
    specs["fc2.weight"]["shape"] = [5, 16]
    with pytest.raises(StateDictMismatchError, match=r"fc2.weight stored \(5, 16\) vs model "
                                                    r"\(3, 16\)"):
        check_fits(model, specs, "m:v1")


# -- builds that cannot run on meta fall back to a CPU build (issue 18) -----------------------

class RunsWhileBuilt(nn.Module):
    """Runs a forward pass in its constructor, as torchvision's SSD heads do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out_features = self.fc(torch.zeros(1, 4)).tolist()


class BufferFromParameter(nn.Module):
    """A non-persistent buffer computed from a parameter: on meta it lands on meta."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones_like(self.fc.weight[0]), persistent=False)


STORED = {"fc.weight", "fc.bias"}


@pytest.mark.parametrize("cls", [RunsWhileBuilt, BufferFromParameter])
@pytest.mark.parametrize("how", ["model", "factory"])
def test_a_build_that_cannot_run_on_meta_is_built_on_the_cpu(
        cls: type[nn.Module], how: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.unit.test_materialize as here

    if how == "model":
        args: tuple[object, ...] = (cls, {})
    else:
        args = (None, {"factory": f"{here.__name__}:{cls.__name__}"})
    with caplog.at_level(logging.DEBUG, logger="registry.model.materialize"):
        module = build_module(*args, (here.__name__,), "m:v1", stored=STORED)  # type: ignore[arg-type]
    assert not any(t.is_meta for t in (*module.parameters(), *module.buffers()))
    assert "building it on the CPU" in caplog.text
    assert cls.__name__ in caplog.text or "test_materialize" in caplog.text


def test_a_meta_buffer_that_the_weights_fill_needs_no_cpu_build(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="registry.model.materialize"):
        module = build_module(BufferFromParameter, {}, (), "m:v1",
                              stored=STORED | {"mask"})
    assert module.fc.weight.is_meta and module.mask.is_meta
    assert "CPU" not in caplog.text
    with caplog.at_level(logging.DEBUG, logger="registry.model.materialize"):
        built = build_module(MLP, {}, (), "m:v1", stored=set(MLP().state_dict()))
    assert all(p.is_meta for p in built.parameters()), "a model that builds on meta stays there"
    assert caplog.text == ""


def test_a_build_that_fails_on_the_cpu_too_raises_its_own_error() -> None:
    def broken() -> nn.Module:
        raise TypeError("__init__() got an unexpected keyword argument 'widht'")

    with pytest.raises(TypeError, match="widht"):
        build_module(broken, {}, (), "m:v1", stored=STORED)


def test_init_functions_skip_meta_tensors_only_while_building() -> None:
    from registry.model.materialize import empty_parameters

    original = torch.nn.init.kaiming_uniform_
    with empty_parameters():
        real = torch.zeros(3)
        assert torch.equal(torch.nn.init.ones_(real), torch.ones(3))  # real tensors still init
        meta = torch.empty(2, 2, device="meta")
        assert torch.nn.init.kaiming_uniform_(meta) is meta
        layer = torch.nn.Linear(4, 2)
        assert layer.weight.is_meta
    assert torch.nn.init.kaiming_uniform_ is original
    assert not torch.nn.Linear(4, 2).weight.is_meta


# -- assigning the weights without load_state_dict's walk --------------------------------------

def _weights_for(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v if not isinstance(v, torch.Tensor)  # extra state
            else torch.randn_like(v.float()).to(v.dtype) if v.is_floating_point()
            else v + 7 for k, v in model.state_dict().items()}


def _frozen_mlp() -> nn.Module:
    model = MLP()
    model.fc1.bias.requires_grad_(False)
    return model


def test_plain_assignment_does_what_load_state_dict_assign_does() -> None:
    torch.manual_seed(0)
    state = _weights_for(MLP())
    fast, slow = _frozen_mlp(), _frozen_mlp()
    assert assign_plainly(fast, state)
    slow.load_state_dict(state, strict=True, assign=True)
    for a, b in ((fast, slow), (fast.bn, slow.bn), (fast.fc1, slow.fc1)):
        assert list(a._parameters) == list(b._parameters)
        assert list(a._buffers) == list(b._buffers)
        assert a._non_persistent_buffers_set == b._non_persistent_buffers_set
    for (name, p), (_, q) in zip(fast.named_parameters(), slow.named_parameters(), strict=True):
        assert type(p) is type(q) is nn.Parameter, name
        assert p.requires_grad == q.requires_grad, name
        assert p.data_ptr() == q.data_ptr() == state[name].data_ptr(), "assigned, not copied"
    for (name, b), (_, c) in zip(fast.named_buffers(), slow.named_buffers(), strict=True):
        assert b is c or (name == "scale" and torch.equal(b, c)), name
    assert not fast.fc1.bias.requires_grad and fast.fc1.weight.requires_grad


class _OwnLoading(nn.Linear):
    def _load_from_state_dict(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super()._load_from_state_dict(*args, **kwargs)


class _ExtraState(nn.Linear):
    def get_extra_state(self) -> object:
        return {"calls": 1}

    def set_extra_state(self, state: object) -> None:
        self.extra = state


def _with_pre_hook() -> nn.Module:
    model = MLP()
    # The private name: the public one arrived after the oldest torch we support.
    model.fc2._register_load_state_dict_pre_hook(lambda *a, **k: None, with_module=True)
    return model


def _with_post_hook() -> nn.Module:
    model = MLP()
    model.register_load_state_dict_post_hook(lambda *a, **k: None)
    return model


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(_OwnLoading(2, 2)),
    lambda: nn.Sequential(_ExtraState(2, 2)),
    _with_pre_hook,
    _with_post_hook,
], ids=["own _load_from_state_dict", "extra state", "pre-hook", "post-hook"])
def test_anything_that_loads_its_own_way_is_left_to_load_state_dict(make) -> None:  # type: ignore[no-untyped-def]
    model = make()
    before = {k: v.data_ptr() for k, v in model.state_dict().items()
              if isinstance(v, torch.Tensor)}
    state = _weights_for(model)
    assert not assign_plainly(model, state)
    assert {k: v.data_ptr() for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor)} == before, "nothing was assigned"


def test_a_parameter_registration_hook_is_left_to_load_state_dict() -> None:
    calls: list[str] = []
    handle = nn.modules.module.register_module_parameter_registration_hook(
        lambda module, name, param: calls.append(name))
    try:
        model = nn.Linear(2, 2)
        calls.clear()
        assert not assign_plainly(model, _weights_for(model))
        fill_module(model, _weights_for(model), {}, lambda _n: torch.device("cpu"))
        assert sorted(calls) == ["bias", "weight"], "the hook saw the loaded weights"
    finally:
        handle.remove()


def test_fill_module_runs_load_hooks_the_plain_path_would_skip() -> None:
    seen: list[str] = []
    model = MLP()
    model.fc2._register_load_state_dict_pre_hook(
        lambda _m, _state, prefix, *rest: seen.append(prefix), with_module=True)
    state = _weights_for(model)
    fill_module(model, state, {}, lambda _n: torch.device("cpu"))
    assert seen == ["fc2."]
    assert model.fc2.weight.data_ptr() == state["fc2.weight"].data_ptr()
