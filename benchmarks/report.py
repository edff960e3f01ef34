"""The results table and the machine facts it was measured on."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path


@dataclass
class Row:
    """One line of the table. ``ok`` is None when the row could not run (``notes`` says why)."""

    number: int
    measure: str
    compared_with: str
    target: str
    measured: str = ""
    ratio: str = ""
    ok: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "**miss**", None: "not run"}[self.ok]


def table(rows: list[Row]) -> str:
    lines = [
        "| # | measure | compared with | measured (median) | ratio | target | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.number} | {r.measure} | {r.compared_with} | {r.measured} | "
                     f"{r.ratio} | {r.target} | {r.verdict} |")
    return "\n".join(lines)


def notes(rows: list[Row]) -> str:
    parts = []
    for r in rows:
        if r.notes:
            parts.append(f"**Row {r.number}** ({r.verdict}): " + " ".join(r.notes))
    return "\n\n".join(parts)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 ** 2:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "registry"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return out + (" (registry/ has uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_facts(root: Path, extra: dict[str, str]) -> dict[str, str]:
    import sqlite3

    import torch

    facts = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(root),
        "cpu": f"{_cpu()}, {os.cpu_count()} logical cores, torch threads "
               f"{torch.get_num_threads()}",
        "memory": _memory(),
        "os": f"{platform.system()} {platform.release()}",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "torch": f"{torch.__version__} (CUDA available: {torch.cuda.is_available()})",
        "sqlite": sqlite3.sqlite_version,
    }
    for dist in ("safetensors", "mlflow", "boto3", "moto", "sqlalchemy", "psycopg"):
        facts[dist] = _version(dist)
    facts.update(extra)
    return facts


def document(rows: list[Row], facts: dict[str, str], command: str) -> str:
    fact_lines = "\n".join(f"- **{k}**: {v}" for k, v in facts.items())
    return f"""# Benchmark results

Produced by `{command}`. Every figure is the median of the runs listed below, taken after a
warm-up, and every ratio compares two things measured side by side in this same run (the cases
are interleaved run by run, so drift in the machine's load hits both alike). Absolute times are
shown for orientation only.

{table(rows)}

## Notes, and why a row misses

{notes(rows)}

## Machine

{fact_lines}
"""
