"""One measurement in a fresh interpreter: ``python -m benchmarks.probe ACTION JSON``.

``resolve`` times ``Registry.show``; the other actions measure the peak RSS of one operation.

The baseline is taken once imports are done and the catalog is open, then the kernel's
high-water mark is reset (``/proc/self/clear_refs`` = 5) so the peak is the operation's own.
Prints one JSON line: ``{"baseline": bytes, "peak": bytes}`` (``resolve``: seconds per ref).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def resolve(options: dict[str, Any]) -> dict[str, float]:
    """Median seconds of ``Registry.show`` per ref, refs taken round-robin (so background work
    such as autovacuum hits every ref alike), after one warm-up call each. ``queried``: every
    call runs the catalog's queries, as the first resolve after a commit does (an SQLite
    catalog otherwise answers an unchanged ref without them, registry/catalog/warm.py)."""
    import statistics
    import time

    import registry

    reg = registry.Registry(home=options["home"], catalog=options["catalog"])
    if options.get("queried"):
        reg.backend.catalog._warm = None  # type: ignore[attr-defined]
    refs = options["refs"]
    samples: dict[str, list[float]] = {ref: [] for ref in refs}
    try:
        for ref in refs:
            reg.show(ref)  # warm-up: connection, schema check
        for _ in range(options["calls"]):
            for ref in refs:
                start = time.perf_counter()
                reg.show(ref)
                samples[ref].append(time.perf_counter() - start)
    finally:
        reg.close()
    return {ref: statistics.median(v) for ref, v in samples.items()}


def main(action: str, options: dict[str, Any]) -> dict[str, Any]:
    if action == "resolve":
        return resolve(options)
    import torch

    from benchmarks.helpers import BenchModel, touch, touch_module

    if action == "pull":
        import registry

        reg = registry.Registry(home=options["home"])
        reg.show(options["ref"])  # open the catalog: its imports are not the pull's memory
        baseline = _status("VmRSS")
        _reset_peak()
        module = reg.pull(options["ref"], device="cpu", dtype=options.get("dtype", "auto"))
        touch_module(module)
    elif action == "torch_load":
        baseline = _status("VmRSS")
        _reset_peak()
        module = BenchModel(**options["kwargs"])
        module.load_state_dict(torch.load(options["path"], map_location="cpu", weights_only=True))
        touch_module(module)
    elif action == "load_file":
        from safetensors.torch import load_file

        baseline = _status("VmRSS")
        _reset_peak()
        touch(load_file(options["path"]).values())
    else:
        raise SystemExit(f"unknown action {action!r}")
    return {"baseline": baseline, "peak": _status("VmHWM")}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
