"""Prints how many blocks of each manual page ran and were skipped (tests/docs/test_manual.py)."""

from __future__ import annotations

import pytest

from tests.docs.test_manual import ROOT, RUNS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RUNS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("the manual's blocks")
    for page in sorted(RUNS):
        run = RUNS[page]
        state = "FAILED" if run.failure else "ok"
        write(f"{page.relative_to(ROOT)}: {len(run.ran)} run, {len(run.skipped)} skipped"
              f" ({state})")
        for block in run.skipped:
            write(f"    skipped {block.line}: {block.skip}")
    ran = sum(len(r.ran) for r in RUNS.values())
    skipped = sum(len(r.skipped) for r in RUNS.values())
    write(f"the manual: {ran} blocks run, {skipped} skipped, on {len(RUNS)} pages")
