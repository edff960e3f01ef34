"""Row 48: what the event log costs a reader. ``Versions.history`` of a model after 1,000 alias
moves on SQLite, beside a resolve of the moved alias on the same catalog (the pull's catalog
step, which reads no event: row 9 measures it alone)."""

from __future__ import annotations

import torch

import registry
from registry.versions import Versions

from .helpers import Bench, Case, duration, interleaved
from .report import Row

MOVES = 1_000
TARGET_S = 0.050


def history_after_moves(b: Bench) -> list[Row]:
    row = Row(48, f"`history(name)` after {MOVES:,} alias moves (SQLite)",
              "`show(name@alias)` on the same catalog", f"median < {TARGET_S * 1000:.0f} ms")
    home = b.scratch("governance-home")
    pusher = registry.Registry(home=home)
    try:
        for i in range(2):
            pusher.push({"w": torch.full((4,), float(i))}, "moved")
    finally:
        pusher.close()
    reg = Versions(home=home)
    try:
        catalog = reg.backend.catalog  # type: ignore[attr-defined]
        for i in range(MOVES):  # straight through the catalog: the seeding is not measured
            catalog.set_alias("moved", "production", 1 + i % 2)
        events = len(reg.history("moved"))
        t = interleaved({
            "history": Case(lambda: reg.history("moved")),
            "resolve": Case(lambda: reg.show("moved@production")),
        }, runs=max(b.runs, 15))
    finally:
        reg.close()
    history, resolve = t["history"].median, t["resolve"].median
    row.measured = f"history {duration(history)} ({events:,} events), resolve {duration(resolve)}"
    row.ratio = f"{history / resolve:.1f}x"
    row.ok = history < TARGET_S
    row.notes.append(
        f"One model, 2 versions, {MOVES:,} moves of one alias (each its own transaction and "
        "`alias.set` event), then the whole history read back as Event objects; "
        f"medians of {max(b.runs, 15)} interleaved runs (spread: history "
        f"{t['history'].spread()} s, resolve {t['resolve'].spread()} s). A resolve reads "
        "no event table: the ratio is what reading the whole log costs against one pull's "
        "catalog step.")
    return [row]
