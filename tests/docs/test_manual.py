"""The manual runs: every ``python``, ``pycon``, ``bash`` and ``console`` block of README.md and
docs/*.md, executed as pasted (tests/docs/pagerun.py says how each kind is run and checked).

One process per page, pages two at a time, each in a fresh temporary directory with a fresh
``REGISTRY_HOME`` (and ``HOME``), no other ``REGISTRY_*`` variable, and this checkout's
``registry`` command first on ``PATH``. Only a block under ``<!-- docs-test: skip (REASON) -->``
is skipped; the counts per page are printed in the terminal summary."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docs.blocks import Block, PageError, page_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGE_TIMEOUT_S = 900
WORKERS = 2


@dataclass
class PageRun:
    page: Path
    blocks: list[Block]
    ran: list[int] = field(default_factory=list)
    failure: str | None = None
    output: str = ""

    @property
    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if b.runs]

    @property
    def skipped(self) -> list[Block]:
        return [b for b in self.blocks if b.skip is not None]


# Filled as pages finish; tests/docs/conftest.py prints it in the terminal summary.
RUNS: dict[Path, PageRun] = {}


def _environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("REGISTRY_") and k not in ("MLFLOW_TRACKING_URI", "PYTEST_ADDOPTS")}
    (tmp / "home").mkdir()
    (tmp / "user").mkdir()
    env.update(
        REGISTRY_HOME=str(tmp / "home"),
        HOME=str(tmp / "user"),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
    )
    for name in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "HF_TOKEN", "HF_HOME"):
        env.pop(name, None)  # a reader's shell, not this test run's
    return env


# Pages that start `registry serve` take turns: the manual's servers share the port it shows.
_SERVING = threading.Lock()


def run_page(page: Path) -> PageRun:
    try:
        run = PageRun(page=page, blocks=page_blocks(page))
    except PageError as exc:
        return PageRun(page=page, blocks=[], failure=str(exc))
    if not run.runnable:
        return run
    if any("registry serve" in block.source for block in run.runnable):
        with _SERVING:
            return _run(run)
    return _run(run)


def _run(run: PageRun) -> PageRun:
    page = run.page
    with tempfile.TemporaryDirectory(prefix=f"docs-{page.stem}-") as tmp:
        cwd = Path(tmp) / "work"
        cwd.mkdir()
        report = Path(tmp) / "report.json"
        log = Path(tmp) / "output.log"
        with log.open("w+", encoding="utf-8", errors="replace") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.docs.pagerun", str(page), str(report)],
                cwd=cwd, env=_environment(Path(tmp)), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=PAGE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                run.failure = f"the page did not finish in {PAGE_TIMEOUT_S} s"
            finally:
                # Whatever the page left running (a server started with `&`) stops with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            out.seek(0)
            run.output = out.read()
        if run.failure is None:
            if not report.exists():
                run.failure = f"the page's process died (exit {proc.returncode})"
            else:
                result = json.loads(report.read_text())
                run.ran = result["ran"]
                if result["failed"]:
                    failed = result["failed"]
                    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
                    run.failure = (f"{where}:{failed['line']}: the "
                                   f"{failed['language']} block starting on this line failed:\n"
                                   f"{failed['why']}")
    return run


@pytest.fixture(scope="session")
def page_runs(request: pytest.FixtureRequest) -> dict[Path, Future[PageRun]]:
    """Every selected page started at once, two processes at a time."""
    pages = [item.callspec.params["page"] for item in request.session.items
             if getattr(item, "callspec", None) and "page" in item.callspec.params
             and item.module is sys.modules[__name__]]
    pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="docs-page")
    request.addfinalizer(lambda: pool.shutdown(cancel_futures=True))
    return {page: pool.submit(run_page, page) for page in dict.fromkeys(pages)}


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_block_of_the_page_runs_as_pasted(page: Path,
                                                page_runs: dict[Path, Future[PageRun]]) -> None:
    run = page_runs[page].result()
    RUNS[page] = run
    if run.failure:
        pytest.fail(f"{run.failure}\n--- the page's output, last 6000 characters:\n"
                    f"{run.output[-6000:]}", pytrace=False)
    assert run.ran == [b.line for b in run.runnable], \
        f"{page.name}: blocks {sorted(set(b.line for b in run.runnable) - set(run.ran))} never ran"
