"""``python -m benchmarks [--quick] [--runs N] [--rows 1,2,...]``: measure, print, write results."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from . import (
    cuda,
    fanout,
    governance,
    hub,
    local,
    oci,
    peers,
    provenance,
    pushes,
    quantized,
    s3,
    signing,
    startup,
    webhooks,
)
from .helpers import FULL, QUICK, ROOT, S3_MODEL, Bench, pin_malloc_threshold
from .report import Row, document, machine_facts, table

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"

# Row groups in the order they run; each returns the rows it fills. Row 13 pulls the model that
# rows 10-11 pushed (or pushes it, when they are not run).
GROUPS = [
    ((1, 2), local.local_pull),
    ((3,), local.peak_rss),
    ((4,), pushes.push),
    ((5, 6), s3.s3_rows),
    ((7,), local.dtype_change),
    ((8,), startup.import_time),
    ((9,), startup.catalog_resolve),
    ((10, 11), pushes.sharded_push),
    ((13,), local.sharded_pull),
    ((12,), s3.sharded_s3_pull),
    ((14, 15), peers.warm_and_cold),
    ((16,), peers.s3_peer),
    ((17,), local.small_pull),
    ((18,), cuda.cuda_pull),
    ((19, 20, 21), oci.oci_rows),
    ((22, 23, 24), quantized.quantized_rows),
    ((34, 35, 36), signing.signed_rows),
    ((37,), fanout.fanout),
    ((42,), webhooks.webhook_rows),
    ((48,), governance.history_after_moves),
    ((50,), hub.hub_rows),
    ((51,), provenance.diff_rows),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="a ~50 MB model instead of ~800 MB (a smoke run; ratios are noisier)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per figure (>= 5)")
    parser.add_argument("--rows", default="", help="comma-separated row numbers to run")
    parser.add_argument("--output", type=Path, default=None,
                        help="where to write the report (default: benchmarks/results.md, or "
                             "benchmarks/.work/results-quick.md with --quick)")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be at least 5: every figure is a median of 5 or more runs")
    every = {n for numbers, _ in GROUPS for n in numbers}
    wanted = {int(x) for x in args.rows.split(",") if x.strip()} or every
    size = QUICK if args.quick else FULL
    output = args.output or (WORK / "results-quick.md" if args.quick else HERE / "results.md")

    malloc = pin_malloc_threshold()
    shutil.rmtree(WORK / "run", ignore_errors=True)
    work = WORK / "run"
    work.mkdir(parents=True)
    started = time.monotonic()
    print(f"building and pushing the {size.label} model ({size.float32_bytes / 1e6:.0f} MB)...",
          file=sys.stderr)
    bench = Bench.create(size, args.runs, work, QUICK if args.quick else S3_MODEL)
    facts = machine_facts(ROOT, {
        "model": f"{size.label}: {size.blocks} blocks of Linear {size.dim} -> {size.hidden} -> "
                 f"{size.dim} + LayerNorm, float32, {size.parameters:,} parameters, "
                 f"{bench.nbytes / 1e6:.0f} MB file (rows 5-6 and 17: "
                 f"{(QUICK if args.quick else S3_MODEL).float32_bytes / 1e6:.0f} MB)",
        "runs": f"median of {args.runs} timed runs after 1 warm-up per figure "
                "(row 8: 7 runs; row 9: 200 calls per ref)",
        "malloc mmap threshold": malloc,
    })
    results: list[Row] = []
    try:
        for numbers, group in GROUPS:
            if not wanted.intersection(numbers):
                continue
            print(f"rows {', '.join(map(str, numbers))}: {group.__name__}...", file=sys.stderr)
            t0 = time.monotonic()
            done = [r for r in group(bench) if r.number in wanted]
            results.extend(done)
            for r in done:
                print(f"  row {r.number}: {r.ratio} ({r.verdict}); {r.measured}", file=sys.stderr)
            print(f"  done in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    finally:
        bench.reg.close()
        shutil.rmtree(work, ignore_errors=True)
    facts["wall time"] = f"{time.monotonic() - started:.0f} s"
    results.sort(key=lambda r: r.number)
    command = "make bench" if not args.quick else "python -m benchmarks --quick"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(document(results, facts, command))
    print(table(results))
    print(f"\nwritten to {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}")
    return 0
