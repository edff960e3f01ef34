"""Adapter records against their tensors and their patterns (issue 45): a regex from a record is
matched by RE2 (linear) and never reaches PEFT, a pattern RE2 cannot run is refused by name, and
ranks that disagree with the stored tensors (r=-4, r=2**40, r=8 over rank-4 tensors) are typed
errors raised before the base is built or anything allocated."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from registry import AdapterError, Registry
from registry.formats.peft import patterns as adapterpatterns
from tests.security.test_manifests import _manifest
from tests.security.test_quantized_records import _gpt2, _tamper

peft = pytest.importorskip("peft")
pytest.importorskip("re2")

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning",
                                        "ignore::FutureWarning")
HANG = 120.0
CATASTROPHIC = "(.|.)*X"  # exponential in Python's re on any path without an X


def _adapter(reg: Registry, **config: Any) -> dict[str, Any]:
    reg.push(_gpt2(), "base")
    options = {"r": 4, "target_modules": ["c_attn"], "fan_in_fan_out": True, **config}
    tuned = peft.get_peft_model(_gpt2(), peft.LoraConfig(**options))
    reg.push(tuned, "q", base="base:v1")
    return _manifest(reg, "q:v1")


def _pull_in_subprocess(home: Path) -> str:
    """The pull in a fresh interpreter killed after HANG s: a catastrophic regex holds the GIL,
    so only a process boundary catches the hang. The error it raised, as ``Name: message``."""
    code = ("import warnings; warnings.simplefilter('ignore')\nimport registry\n"
            f"reg = registry.Registry(home={str(home)!r})\n"
            "try:\n    reg.pull('q:v1', device='cpu')\nexcept Exception as exc:\n"
            "    print(type(exc).__name__ + ': ' + str(exc))\nelse:\n    print('no error')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("field", ["target_modules", "exclude_modules"])
def test_a_catastrophic_pattern_is_matched_in_linear_time(reg: Registry, home: Path,
                                                          field: str) -> None:
    manifest = _adapter(reg)
    manifest["adapter"]["config"][field] = CATASTROPHIC + "a" * 20
    _tamper(reg, manifest)
    answer = _pull_in_subprocess(home)
    if field == "target_modules":  # matches nothing: refused, as any absent target
        assert answer.startswith("AdapterError: ") and "base does not have" in answer
    else:  # excludes nothing: the adapter loads as stored
        assert answer == "no error"


def test_a_catastrophic_rank_pattern_key_never_reaches_peft(reg: Registry, home: Path) -> None:
    manifest = _adapter(reg)
    manifest["adapter"]["config"]["rank_pattern"] = {CATASTROPHIC + "b" * 30: 4}
    _tamper(reg, manifest)
    assert _pull_in_subprocess(home) == "no error"


@pytest.mark.parametrize(("field", "value"), [
    ("target_modules", "(c)_attn\\1"), ("target_modules", "(?=c).*c_attn"),
    ("exclude_modules", "(?!x).*"), ("rank_pattern", {"(a)\\1": 4}),
    ("alpha_pattern", {"(?<=h)c_attn": 8}), ("target_modules", "a" * 300),
    ("layers_pattern", "(h|h)+"), ("modules_to_save", ["(a+)+"]),
])
def test_a_pattern_re2_cannot_run_is_refused_by_name(reg: Registry, field: str,
                                                     value: Any) -> None:
    manifest = _adapter(reg)
    manifest["adapter"]["config"][field] = value
    _tamper(reg, manifest)
    with pytest.raises(AdapterError, match=field):
        reg.pull("q:v1", device="cpu")


def test_patterns_select_what_peft_would_and_peft_sees_only_literals(reg: Registry) -> None:
    """The control: a pattern target and a rank pattern load, PEFT given literal paths."""
    manifest = _adapter(reg, target_modules=r".*\.c_(attn|proj)", rank_pattern={"c_proj": 2},
                        r=4)
    module: Any = reg.pull("q:v1", device="cpu")
    config = module.peft_config["default"]
    assert config.target_modules == r"(?:transformer\.h\.0\.attn\.c_attn|" \
        r"transformer\.h\.0\.attn\.c_proj|transformer\.h\.0\.mlp\.c_proj)"
    assert list(config.rank_pattern) == [
        r"(?:transformer\.h\.0\.attn\.c_proj|transformer\.h\.0\.mlp\.c_proj)"]
    assert module.base_model.model.transformer.h[0].mlp.c_proj.lora_A["default"].weight.shape[0] \
        == 2
    stored = manifest["tensors"]["base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight"]
    assert stored["shape"][0] == 2


def test_the_pattern_module_matches_like_re_on_plain_patterns() -> None:
    paths = ["a.b.c", "a.bc", "x.a.b.c", "c"]
    for pattern in [r"a\.b\.c", r".*c", r"(a|x)\..*", "c"]:
        assert adapterpatterns.selected(pattern, paths, "t", "o") == [
            p for p in paths if __import__("re").fullmatch(pattern, p)]
    assert adapterpatterns.selected("b.c", paths, "t", "o", suffix=True) == ["a.b.c", "x.a.b.c"]


# -- ranks against tensors ----------------------------------------------------------------------

@pytest.mark.parametrize(("edit", "match"), [
    (lambda c: c.update(r=-4), "sets r to -4"),
    (lambda c: c.update(r=2**40), "sets r to 1099511627776"),
    (lambda c: c.update(r=True), "sets r to True"),
    (lambda c: c.update(r=8), "has rank 4"),
    (lambda c: c.update(rank_pattern={"c_attn": 2}), "has rank 4"),
    (lambda c: c.update(rank_pattern={"c_attn": 2**40}), "rank_pattern"),
], ids=["negative", "huge", "bool", "over", "pattern-under", "pattern-huge"])
def test_ranks_that_disagree_with_the_tensors_are_refused_before_the_base_is_built(
        reg: Registry, edit: Any, match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = _adapter(reg)
    edit(manifest["adapter"]["config"])
    _tamper(reg, manifest)
    built: list[int] = []
    monkeypatch.setattr(torch.nn.Module, "__init__", _counting(built, torch.nn.Module.__init__))
    with pytest.raises(AdapterError, match=match):
        reg.pull("q:v1", device="cpu")
    assert built == []  # nothing was built: neither the base nor a LoRA layer
    with pytest.raises(AdapterError, match=match):
        reg.save_pretrained("q:v1", reg.settings.home / "out")


def test_tensors_on_modules_the_base_lacks_are_refused_before_it_is_built(
        reg: Registry) -> None:
    manifest = _adapter(reg)
    tensors = manifest["tensors"]
    for key in list(tensors):
        tensors[key.replace("attn.c_attn", "attn.c_nothing")] = tensors.pop(key)
    manifest["files"][0]["tensors"] = list(tensors)
    if manifest.get("key_order"):
        manifest["key_order"] = [k.replace("attn.c_attn", "attn.c_nothing")
                                 for k in manifest["key_order"]]
    _tamper(reg, manifest)
    with pytest.raises(AdapterError, match="c_nothing"):
        reg.pull("q:v1", device="cpu")


def _counting(built: list[int], init: Any) -> Any:
    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)
    return counted
