"""Why stored keys do not fit a module: a prefix or suffix is named before another
architecture is suggested (issue #30)."""

from __future__ import annotations

from registry.model.keyfit import likely_cause

PLAIN = ["conv1.weight", "conv1.bias", "fc.weight", "fc.bias"]


def test_stored_keys_carrying_a_prefix_are_named() -> None:
    stored = [f"module.{k}" for k in PLAIN]
    cause = likely_cause(PLAIN, stored)
    assert "the stored keys carry the prefix 'module.'" in cause
    assert "(e.g. stored 'module.conv1.weight' vs model 'conv1.weight')" in cause


def test_a_chain_of_wrapper_prefixes_is_named_whole() -> None:
    stored = [f"_orig_mod.module.{k}" for k in PLAIN]
    assert "prefix '_orig_mod.module.'" in likely_cause(PLAIN, stored)


def test_a_model_wrapped_or_nesting_the_network_is_named() -> None:
    assert "wrapped in torch.compile" in likely_cause([f"_orig_mod.{k}" for k in PLAIN], PLAIN)
    assert "nests the network under 'net'" in likely_cause([f"net.{k}" for k in PLAIN], PLAIN)


def test_keys_differing_at_their_ends_are_named() -> None:
    model = ["fc.parametrizations.weight.original0", "fc.parametrizations.weight.original1",
             "fc.bias"]
    stored = ["fc.weight_g", "fc.weight_v", "fc.bias"]
    cause = likely_cause(model, stored)
    assert "differ at their ends" in cause and "weight_norm" in cause


def test_unrelated_keys_suggest_another_architecture() -> None:
    cause = likely_cause(PLAIN, ["encoder.layers.0.weight", "decoder.out.bias"])
    assert "architecture or configuration differs" in cause
