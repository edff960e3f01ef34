"""The walk of a push through the package, followed call by call from ``registry.push`` (issue
#47): the rooms (modules) it enters and how often it climbs back up into one it had left, as
tests/walk.py defines them. The goal: a push hands the model to one place that decides its format
and flattens it, then works step by step on tensors and records without going back to a module it
has left, so no module is entered more than twice and the walk climbs back up at most 4 times.

Measured on the code before #47 (this tracer, 2026-11-28): a float push 25 rooms and 10 climbs
(``attachments``, ``normalize`` and the signing mixin entered 3 times each; torchao and dynamic
the same), an adapter push 21 rooms and 10 climbs. With the push pipeline
(registry/pipelines/push.py), the facade composed and the formats behind registry/formats/table.py:
3 climbs for a float, torchao or dynamic push, 2 for an adapter, no room entered more than twice,
each format module once. The climbs left: the lineage is begun before the shards and finished
after them (``provenance.capture`` and ``provenance.lineage``), and the name is found after the
flatten (``model.architectures``, which the flatten enters to record the architecture; an
adapter's name is its format's). The bounds below are where the code stands; they only go down.
:meth:`tests.walk.Walk.render` draws a walk (a failure shows it).
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import registry
from tests.walk import Walk, follow


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _float() -> nn.Module:
    torch.manual_seed(0)
    return Tiny()


def _torchao() -> nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = _float()
    quantize_(model, Int8WeightOnlyConfig())
    return model


def _dynamic() -> nn.Module:
    return torch.ao.quantization.quantize_dynamic(_float(), {nn.Linear}, dtype=torch.qint8)


def _adapter() -> nn.Module:
    import peft

    registry.push(_float(), "tiny-base")
    config = peft.LoraConfig(r=2, target_modules=["a"], init_lora_weights=False)
    return peft.get_peft_model(_float(), config)


# case -> (the model, push kwargs, most climbs back up, most entries of one room)
CASES: dict[str, tuple[Callable[[], nn.Module], dict[str, str], int, int]] = {
    "float": (_float, {}, 4, 2),
    "torchao-int8": (_torchao, {}, 4, 2),
    "dynamic-qint8": (_dynamic, {}, 4, 2),
    "adapter": (_adapter, {"base": "tiny-base"}, 3, 2),
}


def _push_walk(case: str) -> Walk:
    make, kwargs, _climbs, _entries = CASES[case]
    registry.push(_float(), "warm-up")  # the default registry opened, its catalog created
    model = make()
    return follow(lambda: registry.push(model, **kwargs))


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_push_climbs_back_up_at_most_so_often(case: str) -> None:
    walk = _push_walk(case)
    _make, _kwargs, climbs, entries = CASES[case]
    assert isinstance(walk.result, registry.ModelVersion)
    shown = f"{case}: {walk.summary()}\n{walk.render()}"
    assert walk.rooms[0] == "registry._api" and "registry.client" in walk.rooms, shown
    assert walk.climbs <= climbs, shown
    assert max(walk.entries.values()) <= entries, shown
    # Each format module once: push decides the format in one place (registry/formats/table.py).
    formats = {r: n for r, n in walk.entries.items() if r.startswith("registry.formats.")
               and r not in ("registry.formats.base", "registry.formats.common")}
    assert "registry.formats.table" in formats and set(formats.values()) == {1}, shown


# -- the tracer itself, on a planted package ---------------------------------------------------

PLANTED = {
    "__init__.py": "",
    "top.py": """
        from . import leaf, mid, port

        def run():
            values = [leaf.value(i) for i in range(3)]  # one entry: a loop over one helper
            mid.work(lambda: values)                     # mid calls back up into top: a climb
            with leaf.guard():                           # leaf again, after mid: a climb
                mid.other()                              # mid again: a climb
            leaf.Rec(1)                                  # a record built: no entry
            port.save()                                  # behind the port: not followed
            return values
    """,
    "mid.py": """
        from . import leaf

        def work(callback):
            leaf.value(0)
            return callback()

        def other():
            return 2
    """,
    "leaf.py": """
        import contextlib
        from dataclasses import dataclass

        @dataclass
        class Rec:
            n: int

        def value(i):
            return i

        @contextlib.contextmanager
        def guard():
            yield  # its exit resumes the same visit
    """,
    "port.py": """
        from . import mid

        def save():
            return mid.other()
    """,
}


def test_the_tracer_counts_rooms_entries_and_climbs(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "walkplant"
    package.mkdir()
    for name, text in PLANTED.items():
        (package / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    from walkplant import top  # type: ignore[import-not-found]

    try:
        walk = follow(top.run, package="walkplant", ports=("walkplant.port",))
    finally:
        for name in [m for m in sys.modules if m.startswith("walkplant")]:
            del sys.modules[name]
    assert walk.result == [0, 1, 2]
    assert walk.render().splitlines() == [
        "walkplant.top  run, <listcomp>",
        "  walkplant.leaf  value",
        "  walkplant.mid  work",
        "    walkplant.leaf  value",
        "    walkplant.top  <lambda>",
        "  walkplant.leaf  guard",
        "  walkplant.mid  other",
    ], walk.render()
    assert walk.rooms == ["walkplant.top", "walkplant.leaf", "walkplant.mid"]
    assert dict(walk.entries) == {"walkplant.top": 2, "walkplant.leaf": 3, "walkplant.mid": 2}
    assert walk.climbs == 4
