"""Real architectures round-trip (issue 18): pushed, pulled with and without model=, weights
bit-for-bit, outputs assert_close. Built from constructors and tiny configs with random init;
nothing is downloaded.

`make test` runs every torchvision classification builder (80, vit_h_14 and regnet_y_128gf
included) plus a sample of timm, detection, segmentation and transformers models: about four
minutes on 2 cores. ``REGISTRY_SWEEP=all`` adds the rest of the list: the 12 detection and 6
segmentation builders, 50 timm models across families and 25 transformers architectures.
"""

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

DETECTION = ["fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_mobilenet_v3_large_fpn",
             "fasterrcnn_resnet50_fpn", "fasterrcnn_resnet50_fpn_v2", "fcos_resnet50_fpn",
             "keypointrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn_v2",
             "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "ssd300_vgg16",
             "ssdlite320_mobilenet_v3_large"]
SAMPLE_DETECTION = ["ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn"]
SEGMENTATION = ["deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "deeplabv3_resnet101",
                "fcn_resnet50", "fcn_resnet101", "lraspp_mobilenet_v3_large"]
SAMPLE_SEGMENTATION = ["lraspp_mobilenet_v3_large"]
# swin and swinv2 are the two the issue names (their builds do not go on meta).
SAMPLE_TIMM = ["swin_tiny_patch4_window7_224", "swinv2_tiny_window8_256", "resnet10t",
               "vit_tiny_patch16_224", "convnext_atto", "levit_128s"]
MORE_TIMM = ["efficientnet_b0", "deit_tiny_patch16_224", "mobilenetv3_small_050", "regnetx_002",
             "resnet18", "efficientnetv2_rw_t", "mobilenetv4_conv_small", "mobilevit_xxs",
             "mobilevitv2_050", "convnextv2_atto", "regnety_002", "densenet121", "dla34", "dpn68",
             "ghostnet_100", "hrnet_w18_small", "inception_v3", "mixnet_s", "rexnet_100",
             "resnest14d", "res2net50_14w_8s", "seresnext26d_32x4d", "xcit_nano_12_p16_224",
             "cait_xxs24_224", "coat_lite_tiny", "pit_ti_224", "poolformer_s12",
             "crossvit_tiny_240", "efficientformer_l1", "edgenext_xx_small", "fastvit_t8",
             "efficientvit_b0", "maxvit_nano_rw_256", "coatnet_nano_rw_224", "eca_nfnet_l0",
             "gernet_s", "lcnet_050", "tiny_vit_5m_224", "eva02_tiny_patch14_224", "repvgg_a0",
             "mobileone_s0", "gcvit_xxtiny", "tnt_s_patch16_224", "mixer_s16_224"]

Case = tuple[Callable[[], nn.Module], str, dict[str, Any], Any]


def _tv_names() -> list[str]:
    from torchvision import models

    return models.list_models(module=models)


def _tv_case(name: str) -> Case:
    from torchvision import models

    size = 224 if name.startswith(("vit", "maxvit", "swin")) else 96
    return (lambda: models.get_model(name), f"torchvision.models:{name}", {},
            torch.randn(1, 3, size, size))


def _detection_case(name: str) -> Case:
    from torchvision.models import detection

    kwargs: dict[str, Any] = {"weights_backbone": None,
                              "num_classes": 2 if name.startswith("keypoint") else 5}
    return (lambda: getattr(detection, name)(**kwargs), f"torchvision.models.detection:{name}",
            kwargs, [torch.rand(3, 160, 160)])


def _segmentation_case(name: str) -> Case:
    from torchvision.models import segmentation

    kwargs: dict[str, Any] = {"weights_backbone": None, "num_classes": 5}
    return (lambda: getattr(segmentation, name)(**kwargs),
            f"torchvision.models.segmentation:{name}", kwargs, torch.randn(1, 3, 96, 96))


def _timm_case(name: str) -> Case:
    import timm

    model = timm.create_model(name)
    size = model.pretrained_cfg["input_size"][1:]
    return (lambda: timm.create_model(name), "timm:create_model", {"model_name": name},
            torch.randn(1, 3, *size))


BUILDERS: dict[str, Callable[[str], Case]] = {
    "tv": _tv_case, "detection": _detection_case, "segmentation": _segmentation_case,
    "timm": _timm_case}
CASES = ([("tv", n) for n in _tv_names()]
         + [("detection", n) for n in (DETECTION if ALL else SAMPLE_DETECTION)]
         + [("segmentation", n) for n in (SEGMENTATION if ALL else SAMPLE_SEGMENTATION)]
         + [("timm", n) for n in SAMPLE_TIMM + (MORE_TIMM if ALL else [])])


def _round_trip(reg: Registry, model: nn.Module, build: Callable[[], nn.Module],
                run: Callable[[nn.Module], Any]) -> None:
    """Pushed ``model`` pulls back bit-for-bit, in key order with its module metadata, with and
    without ``model=``, and computes what it computed."""
    expected = model.state_dict()
    state = reg.pull_state_dict("m", device="cpu")
    assert list(state) == list(expected), "key order"
    assert dict(state._metadata) == {  # type: ignore[attr-defined]
        p: {"version": e["version"]} for p, e in expected._metadata.items()}  # type: ignore[attr-defined]
    with torch.no_grad():
        want = run(model)
        for spec in (None, build):
            pulled = reg.pull("m", device="cpu", model=spec)
            got = pulled.state_dict()
            assert list(got) == list(expected)
            for key, value in expected.items():
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            torch.testing.assert_close(run(pulled), want)
            del pulled, got


@pytest.mark.parametrize(("kind", "name"), CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_architecture_round_trips(kind: str, name: str, tmp_path: Path) -> None:
    build, factory, kwargs, x = BUILDERS[kind](name)
    torch.manual_seed(0)
    model = build().eval()
    reg = Registry(home=tmp_path / "home")
    try:
        reg.push(model, "m", factory=factory, factory_kwargs=kwargs)
        _round_trip(reg, model, build, lambda m: m(x))
    finally:
        reg.close()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)


# -- transformers, from tiny configs ----------------------------------------------------------

TINY = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64}
SEQ2SEQ = {"encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
           "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
           "d_model": 32}
# model_type -> (head, config overrides). Heads: causal LM, masked LM, seq2seq LM, images.
TRANSFORMERS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("causal", {}),
    "bert": ("masked", {}),
    "llama": ("causal", {"num_key_value_heads": 1}),
    "t5": ("seq2seq", {"d_model": 32, "d_ff": 64, "d_kv": 16, "num_heads": 2, "num_layers": 2,
                       "num_decoder_layers": 2}),
    "roberta": ("masked", {"pad_token_id": 1}),
    "distilbert": ("masked", {"dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64}),
    "albert": ("masked", {"embedding_size": 16}),
    "electra": ("masked", {"embedding_size": 16}),
    "deberta-v2": ("masked", {}),
    "xlm-roberta": ("masked", {"pad_token_id": 1}),
    "mistral": ("causal", {"num_key_value_heads": 1}),
    "qwen2": ("causal", {"num_key_value_heads": 1}),
    "qwen3": ("causal", {"num_key_value_heads": 1, "head_dim": 16}),
    "gemma": ("causal", {"num_key_value_heads": 1, "head_dim": 16}),
    "phi": ("causal", {}),
    "falcon": ("causal", {}),
    "bloom": ("causal", {"n_layer": 2, "n_head": 2}),
    "opt": ("causal", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "gpt_neo": ("causal", {"num_layers": 2, "attention_types": [[["global", "local"], 1]]}),
    "gptj": ("causal", {"rotary_dim": 8, "n_positions": 64}),
    "gpt_neox": ("causal", {}),
    "bart": ("seq2seq", SEQ2SEQ),
    "mbart": ("seq2seq", SEQ2SEQ),
    "pegasus": ("seq2seq", SEQ2SEQ),
    "vit": ("image", {"image_size": 32, "patch_size": 8, "num_labels": 3}),
}
SAMPLE_TRANSFORMERS = ["gpt2", "bert", "llama", "t5"]


def _transformers_case(model_type: str) -> tuple[Callable[[], nn.Module],
                                                 Callable[[nn.Module], Any]]:
    import transformers as tf

    head, overrides = TRANSFORMERS[model_type]
    config = tf.AutoConfig.for_model(model_type, **{**TINY, **overrides})
    auto = {"causal": tf.AutoModelForCausalLM, "masked": tf.AutoModelForMaskedLM,
            "seq2seq": tf.AutoModelForSeq2SeqLM,
            "image": tf.AutoModelForImageClassification}[head]
    ids = torch.randint(3, 100, (1, 12))
    inputs: dict[str, Any] = {"input_ids": ids}
    if head == "seq2seq":
        inputs["decoder_input_ids"] = ids[:, :6]
    if head == "image":
        inputs = {"pixel_values": torch.randn(1, 3, 32, 32)}
    if head in ("causal", "seq2seq"):
        inputs["use_cache"] = False
    return (lambda: auto.from_config(config),
            lambda m: m(**inputs).logits)


@pytest.mark.parametrize("model_type", list(TRANSFORMERS) if ALL else SAMPLE_TRANSFORMERS)
def test_transformers_config_round_trips(model_type: str, tmp_path: Path) -> None:
    build, run = _transformers_case(model_type)
    torch.manual_seed(0)
    model = build().eval()
    reg = Registry(home=tmp_path / "home")
    try:
        reg.push(model, "m")
        _round_trip(reg, model, build, run)
    finally:
        reg.close()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)


# -- the four the issue names, pushed the other ways users push them ---------------------------

NAMED = [("tv", "mnasnet0_5"), ("timm", "swin_tiny_patch4_window7_224"),
         ("timm", "swinv2_tiny_window8_256"), ("detection", "ssdlite320_mobilenet_v3_large")]


@pytest.mark.parametrize(("kind", "name"), NAMED, ids=[f"{k}-{n}" for k, n in NAMED])
def test_named_architectures_from_fp16_dataparallel_and_a_pth_file(kind: str, name: str,
                                                                   tmp_path: Path) -> None:
    build, factory, kwargs, x = BUILDERS[kind](name)
    torch.manual_seed(0)
    model = build().eval()
    reg = Registry(home=tmp_path / "home")
    try:
        # A .pth file of the state dict, as a training script saves it.
        torch.save(model.state_dict(), tmp_path / "weights.pth")
        reg.push(tmp_path / "weights.pth", "m", factory=factory, factory_kwargs=kwargs)
        _round_trip(reg, model, build, lambda m: m(x))
        # fp16 inside DataParallel: keys come back without "module.", in fp16 as stored.
        half = build().eval().half()
        reg.push(torch.nn.DataParallel(half), "h", factory=factory, factory_kwargs=kwargs)
        expected = half.state_dict()
        for spec in (None, build):
            got = reg.pull("h", device="cpu", dtype="float16", model=spec).state_dict()
            assert list(got) == list(expected)
            for key, value in expected.items():
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        assert dict(reg.pull_state_dict("h", device="cpu")._metadata) == {  # type: ignore[attr-defined]
            p: {"version": e["version"]} for p, e in expected._metadata.items()}  # type: ignore[attr-defined]
    finally:
        reg.close()
        shutil.rmtree(tmp_path / "home", ignore_errors=True)
