"""Real architectures round-trip (issue 18): pushed, pulled with and without model=, weights
bit-for-bit, outputs assert_close. Built from constructors with random init; nothing is
downloaded. The default sample stays within a few minutes on 2 cores; REGISTRY_SWEEP=all runs
every torchvision classification builder and the longer timm/transformers lists."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from registry import Registry

ALL = os.environ.get("REGISTRY_SWEEP", "").lower() == "all"  # read at collection time
pytestmark = pytest.mark.slow

# The four the issue names (MNASNet's version metadata, swin/swinv2/ssdlite's meta builds).
REQUIRED_TV = ["mnasnet0_5"]
SAMPLE_TV = ["resnet18", "mobilenet_v3_small", "squeezenet1_1", "regnet_y_400mf"]
SAMPLE_TIMM = ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "resnet10t",
               "vit_tiny_patch16_224"]
MORE_TIMM = ["efficientnet_b0", "convnext_atto", "deit_tiny_patch16_224", "levit_128s",
             "mobilenetv3_small_050", "regnetx_002"]


def _tv_names() -> list[str]:
    from torchvision import models

    return models.list_models(module=models) if ALL else REQUIRED_TV + SAMPLE_TV


def _tv_case(name: str) -> tuple[Callable[[], nn.Module], str, dict[str, Any], torch.Tensor]:
    from torchvision import models

    size = 224 if name.startswith(("vit", "maxvit", "swin")) else 96
    return (lambda: models.get_model(name), f"torchvision.models:{name}", {},
            torch.randn(1, 3, size, size))


def _timm_case(name: str) -> tuple[Callable[[], nn.Module], str, dict[str, Any], torch.Tensor]:
    import timm

    model = timm.create_model(name)
    size = model.pretrained_cfg["input_size"][1]
    return (lambda: timm.create_model(name), "timm:create_model", {"model_name": name},
            torch.randn(1, 3, size, size))


def _ssdlite_case() -> tuple[Callable[[], nn.Module], str, dict[str, Any], list[torch.Tensor]]:
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    kwargs: dict[str, Any] = {"weights_backbone": None, "num_classes": 5}
    return (lambda: ssdlite320_mobilenet_v3_large(**kwargs),
            "torchvision.models.detection:ssdlite320_mobilenet_v3_large", kwargs,
            [torch.rand(3, 160, 160)])


CASES = ([("tv", n) for n in _tv_names()] + [("ssdlite", "ssdlite320_mobilenet_v3_large")]
         + [("timm", n) for n in SAMPLE_TIMM + (MORE_TIMM if ALL else [])])


@pytest.mark.parametrize(("kind", "name"), CASES, ids=[n for _, n in CASES])
def test_architecture_round_trips(kind: str, name: str, tmp_path: Path) -> None:
    build, factory, kwargs, x = {"tv": _tv_case, "timm": _timm_case}.get(
        kind, lambda _n: _ssdlite_case())(name)
    torch.manual_seed(0)
    model = build().eval()
    reg = Registry(home=tmp_path / "home")
    try:
        reg.push(model, "m", factory=factory, factory_kwargs=kwargs)
        expected = model.state_dict()
        state = reg.pull_state_dict("m", device="cpu")
        assert list(state) == list(expected), "key order"
        assert dict(state._metadata) == {  # type: ignore[attr-defined]
            p: {"version": e["version"]} for p, e in expected._metadata.items()}  # type: ignore[attr-defined]
        with torch.no_grad():
            want = model(x)
            for spec in (None, build):
                pulled = reg.pull("m", device="cpu", model=spec)
                got = pulled.state_dict()
                for key, value in expected.items():
                    assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
                torch.testing.assert_close(pulled(x), want)
    finally:
        reg.close()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)


def _tiny_transformers() -> dict[str, Callable[[], nn.Module]]:
    import transformers as tf

    small = {"vocab_size": 100}
    return {
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, **small)),
        "bert": lambda: tf.BertModel(tf.BertConfig(num_hidden_layers=2, hidden_size=32,
                                                   num_attention_heads=2, intermediate_size=64,
                                                   **small)),
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=64, **small)),
    }


@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_transformers_config_round_trips(name: str, tmp_path: Path) -> None:
    build = _tiny_transformers()[name]
    torch.manual_seed(0)
    model = build().eval()
    ids = torch.randint(0, 100, (1, 12))
    reg = Registry(home=tmp_path / "home")
    try:
        reg.push(model, "m")
        expected = model.state_dict()
        assert list(reg.pull_state_dict("m", device="cpu")) == list(expected)
        pulled = reg.pull("m", device="cpu", model=build)
        got = pulled.state_dict()
        for key, value in expected.items():
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        with torch.no_grad():
            torch.testing.assert_close(pulled(ids, use_cache=False)[0] if name != "bert"
                                       else pulled(ids)[0], model(ids)[0])
    finally:
        reg.close()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)
