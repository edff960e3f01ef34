"""A manifest's transformers architecture is untrusted (issue 11): only a ``PreTrainedModel``
subclass that ``transformers`` exports at top level is built, only once its name is a public
identifier; the config must be a bounded JSON object, and keys that would load code or kernels
from elsewhere are dropped. Manifests are edited in the catalog, as someone with write access
to it could."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import pytest
import torch
from sqlalchemy import text

from registry import (
    ArchitectureUnknownError,
    ManifestError,
    Registry,
    RegistryError,
    UntrustedFactoryError,
)
from registry.model.architectures import MAX_CONFIG_BYTES
from tests.helpers import trained_mlp


def _edit_architecture(reg: Registry, name: str, architecture: Any) -> None:
    manifest = copy.deepcopy(reg.show(name).metadata) | {"tags": reg.show(name).tags}
    manifest["architecture"] = architecture
    with reg._backend.catalog.engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(text("UPDATE registry_versions SET manifest = :m WHERE version = 1 AND "
                          "model_id = (SELECT id FROM registry_models WHERE name = :n)"),
                     {"m": json.dumps(manifest), "n": name})


def _tiny_bert() -> Any:
    import transformers as tf

    return tf.BertModel(tf.BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                                      intermediate_size=32, vocab_size=50))


CONFIG = {"model_type": "bert"}


@pytest.mark.parametrize(("architecture", "error", "message"), [
    ({"kind": "transformers", "class": "this:Zen", "config": CONFIG}, ManifestError,
     "not 'transformers:<ClassName>'"),
    ({"kind": "transformers", "class": "transformers:_LazyModule", "config": CONFIG},
     ManifestError, "public name"),
    ({"kind": "transformers", "class": "transformers:__class__", "config": CONFIG},
     ManifestError, "public name"),
    ({"kind": "transformers", "class": "transformers:models.bert.BertModel", "config": CONFIG},
     ManifestError, "public name"),
    ({"kind": "transformers", "class": ["transformers:BertModel"], "config": CONFIG},
     ManifestError, "class"),
    ({"kind": "transformers", "class": "transformers:BertModel", "config": "bert"},
     ManifestError, "config is 'bert', not a JSON object"),
    ({"kind": "transformers", "class": "transformers:BertModel", "config": [CONFIG]},
     ManifestError, "not a JSON object"),
    ({"kind": "transformers", "class": "transformers:BertModel",
      "config": {"x": "a" * MAX_CONFIG_BYTES}}, ManifestError, "more than"),
    ({"kind": "transformers", "class": "transformers:BertModel", "config": CONFIG,
      "generation_config": 7}, ManifestError, "generation_config"),
    ({"kind": "transformers", "class": "transformers:pipeline", "config": CONFIG},
     UntrustedFactoryError, "not a PreTrainedModel class"),
    ({"kind": "transformers", "class": "transformers:AutoModel", "config": CONFIG},
     UntrustedFactoryError, "not a PreTrainedModel class"),
    ({"kind": "transformers", "class": "transformers:BertConfig", "config": CONFIG},
     UntrustedFactoryError, "not a PreTrainedModel class"),
    ({"kind": "transformers", "class": "transformers:os", "config": CONFIG},
     UntrustedFactoryError, "not a PreTrainedModel class"),
    ({"kind": "transformers", "class": "transformers:NoSuchModel", "config": CONFIG},
     UntrustedFactoryError, "not a PreTrainedModel class"),
    ({"kind": "transformers", "class": "transformers:BertModel",
      "config": {"model_type": "bert", "hidden_size": "huge"}}, ArchitectureUnknownError,
     "from its recorded config failed"),
    ({"kind": "pickle", "class": "os:system"}, ArchitectureUnknownError, "does not know"),
    ({"kind": ["transformers"]}, ManifestError, "kind"),
])
def test_hostile_architectures_are_refused(reg: Registry, architecture: Any,
                                           error: type[RegistryError], message: str) -> None:
    reg.push(trained_mlp(), "m")
    _edit_architecture(reg, "m", architecture)
    with pytest.raises(error, match=message):
        reg.pull("m", device="cpu")
    assert "this" not in sys.modules


def test_a_config_that_asks_for_remote_code_or_hub_kernels_is_built_without_them(
        reg: Registry) -> None:
    model = _tiny_bert()
    version = reg.push(model, "bert")
    architecture = copy.deepcopy(version.metadata["architecture"])
    architecture["config"].update(
        auto_map={"AutoModel": "evil/repo--modeling.Evil"},
        attn_implementation="kernels-community/evil", _attn_implementation="kernels-community/x",
        quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True},
        trust_remote_code=True, dtype="set_default_device", torch_dtype="load")
    _edit_architecture(reg, "bert", architecture)
    pulled = reg.pull("bert", device="cpu")
    assert type(pulled) is type(model)
    assert "kernels-community" not in str(pulled.config._attn_implementation)
    assert not hasattr(pulled.config, "auto_map")
    assert not hasattr(pulled.config, "quantization_config")
    assert pulled.embeddings.word_embeddings.weight.device.type == "cpu"
    assert pulled.config.dtype in (None, torch.float32)  # not getattr(torch, <hostile name>)


def test_a_config_of_another_architecture_fails_as_a_mismatch(reg: Registry) -> None:
    version = reg.push(_tiny_bert(), "bert")
    architecture = copy.deepcopy(version.metadata["architecture"])
    architecture["config"]["hidden_size"] = 32
    _edit_architecture(reg, "bert", architecture)
    with pytest.raises(RegistryError, match="shape mismatch"):
        reg.pull("bert", device="cpu")
