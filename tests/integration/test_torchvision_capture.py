"""torchvision models as the design card pushes them (issue #30): the builder and its
shape-changing arguments are recorded, the version is named after the builder, and a pull needs
neither ``model=`` nor ``factory=``."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import pytest
import torch
import torchvision.models as tvm
from torch import nn

import registry
from registry import RefError, Registry
from registry.model.architectures import capture
from registry.model.materialize import empty_parameters


def _on_meta(name: str, **kwargs: object) -> nn.Module:
    builder = tvm.get_model_builder(name)
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs.setdefault("weights_backbone", None)
    with empty_parameters(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # googlenet/inception's init notice
        return builder(weights=None, **kwargs)


def test_the_design_cards_calls_work_verbatim(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_HOME", str(home))
    torch.manual_seed(0)
    model = tvm.resnet18(weights=None).eval()
    mv = registry.push(model, {"dataset": "imagenet"})  # the card: tags in the name's place
    assert mv.ref == "resnet18:v1" and mv.tags == {"dataset": "imagenet"}
    assert mv.metadata["architecture"]["factory"] == "torchvision.models:resnet18"
    assert mv.metadata["architecture"]["factory_kwargs"] == {}

    pulled = registry.pull("resnet18:v1", device="auto")  # no model=, no factory=
    assert type(pulled) is type(model)
    expected = torch.cuda.is_available() and "cuda" or "cpu"  # "auto": the GPU where one is
    assert next(pulled.parameters()).device.type == expected
    pulled.cpu()  # CUDA kernels (TF32 convolutions) need not agree with the CPU's bit for bit
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(pulled(x), model(x))

    # A resnet50 pushed the same way is a model of its own: resnet18:latest stays a resnet18.
    other = registry.push(tvm.resnet50(weights=None), tags={"dataset": "imagenet"})
    assert other.ref == "resnet50:v1"
    assert registry.show("resnet18:latest").version == 1


def test_tags_given_twice_are_refused(reg: Registry) -> None:
    with pytest.raises(RefError, match="tags given twice"):
        reg.push(tvm.squeezenet1_1(weights=None), {"a": "1"}, tags={"b": "2"})


@pytest.mark.parametrize(
    ("name", "kwargs", "ref"),
    [
        ("squeezenet1_1", {"num_classes": 10}, "squeezenet1_1:v1"),
        ("efficientnet_b0", {}, "efficientnet_b0:v1"),
        ("lraspp_mobilenet_v3_large", {"num_classes": 5, "weights_backbone": None},
         "lraspp_mobilenet_v3_large:v1"),
        ("raft_small", {}, "raft_small:v1"),
    ],
)
def test_push_records_the_builder_and_pull_rebuilds_it(reg: Registry, name: str,
                                                         kwargs: dict[str, object],
                                                         ref: str) -> None:
    torch.manual_seed(0)
    model = tvm.get_model(name, weights=None, **kwargs).eval()
    mv = reg.push(model)
    assert mv.ref == ref
    recorded = mv.metadata["architecture"]["factory_kwargs"]
    assert {k: v for k, v in recorded.items() if k != "weights_backbone"} == \
        {k: v for k, v in kwargs.items() if k != "weights_backbone"}
    pulled = reg.pull(ref, device="cpu")
    assert type(pulled) is type(model)
    got, want = pulled.state_dict(), model.state_dict()
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("resnet18", {"num_classes": 10}, {"num_classes": 10}),
        ("googlenet", {"aux_logits": False, "num_classes": 7},
         {"aux_logits": False, "num_classes": 7}),
        ("inception_v3", {"aux_logits": False}, {"aux_logits": False}),
        ("fasterrcnn_resnet50_fpn", {"num_classes": 3},
         {"num_classes": 3, "weights_backbone": None}),
        ("maskrcnn_resnet50_fpn", {"num_classes": 2},
         {"num_classes": 2, "weights_backbone": None}),
        ("deeplabv3_resnet50", {"num_classes": 5, "aux_loss": True},
         {"num_classes": 5, "aux_loss": True, "weights_backbone": None}),
        ("r3d_18", {"num_classes": 4}, {"num_classes": 4}),
    ],
)
def test_shape_changing_arguments_are_found(name: str, kwargs: dict[str, object],
                                            expected: dict[str, object]) -> None:
    record = capture(_on_meta(name, **kwargs))
    assert record["factory"].rpartition(":")[2] == name
    assert record["factory_kwargs"] == expected


def test_a_model_no_builder_gives_is_named_by_class_with_a_warning(reg: Registry) -> None:
    model = tvm.squeezenet1_1(weights=None)
    model.classifier = nn.Sequential(nn.Flatten(), nn.Linear(512 * 13 * 13, 3))
    with pytest.warns(UserWarning, match=r"no torchvision builder .*factory='torchvision"):
        mv = reg.push(model)
    assert mv.ref == "squeezenet:v1"
    assert "factory" not in mv.metadata["architecture"]


def test_builders_sharing_a_signature_are_not_guessed() -> None:
    # The 320 variant differs only in its image sizes: same keys and shapes, other outputs.
    with pytest.warns(UserWarning, match="several torchvision builders"):
        record = capture(_on_meta("fasterrcnn_mobilenet_v3_large_320_fpn"))
    assert record == {}


def test_a_user_subclass_is_not_taken_for_the_builder() -> None:
    class Mine(tvm.ResNet):  # type: ignore[misc, name-defined]
        pass

    model = Mine(tvm.resnet.BasicBlock, [2, 2, 2, 2])
    assert capture(model) == {}  # not from torchvision: nothing recorded, nothing said


def test_an_explicit_factory_wins(reg: Registry) -> None:
    mv = reg.push(tvm.squeezenet1_1(weights=None), "sq", factory="torchvision.models:squeezenet1_1")
    assert mv.metadata["architecture"]["factory"] == "torchvision.models:squeezenet1_1"


_TWINS = {"fasterrcnn_mobilenet_v3_large_fpn", "fasterrcnn_mobilenet_v3_large_320_fpn"}
# Builds its anchors against a real tensor: it does not build on meta, so it is not recognised.
_NOT_ON_META = {"ssdlite320_mobilenet_v3_large"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(tvm.list_models()) - _TWINS - _NOT_ON_META))
def test_every_builder_that_builds_on_meta_is_recorded_as_itself(name: str) -> None:
    record = capture(_on_meta(name))
    builder = tvm.get_model_builder(name)
    assert record["factory"].rpartition(":")[2] == builder.__name__
    assert set(record["factory_kwargs"]) <= {"weights_backbone"}
