"""Each format module is entered once on a push and once on a pull (issue #47), as tests/walk.py
counts entries: push hands the model to ``formats.table.flatten`` once, which asks each format
once whether the model is in it; pull hands the version to ``formats.table.pull`` once, and its
format checks the record, decides its steps, calls the pipeline back to read by them and
rebuilds what was read in that one visit (an adapter: its base pulled and its tensors read by
callbacks, then attached, PEFT's attach no longer calling back into it)."""

from __future__ import annotations

import pytest

import registry
from tests.walk import Walk, follow

from .test_push_walk import CASES, _float

FORMATS = {f"registry.formats.{m}" for m in ("floats", "torchao", "dynamic", "ctensors", "lora")}
# case -> the format module that stores it (the others are asked at push and say no)
STORED_BY = {"float": "floats", "torchao-int8": "torchao", "dynamic-qint8": "dynamic",
             "adapter": "lora"}


def _entries(walk: Walk) -> dict[str, int]:
    return {room: n for room, n in walk.entries.items() if room in FORMATS}


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("case", sorted(STORED_BY))
def test_a_push_and_a_pull_each_enter_a_format_once(case: str) -> None:
    make, kwargs, _climbs, _most = CASES[case]
    registry.push(_float(), "warm-up")  # the default registry opened, its catalog created
    model = make()
    pushed = follow(lambda: registry.push(model, case, **kwargs))
    entries = _entries(pushed)
    shown = f"{case}: {pushed.summary()}\n{pushed.render()}"
    assert f"registry.formats.{STORED_BY[case]}" in entries, shown
    assert set(entries.values()) == {1}, shown

    registry.pull(case, device="cpu", model=_float)  # PEFT's first attach is its own
    pulled = follow(lambda: registry.pull(case, device="cpu", model=_float))
    entries = _entries(pulled)
    shown = f"{case}: {pulled.summary()}\n{pulled.render()}"
    assert max(entries.values(), default=0) <= 1, shown
    if STORED_BY[case] != "floats":  # a float version's steps are the empty ones: not entered
        assert entries.get(f"registry.formats.{STORED_BY[case]}") == 1, shown
