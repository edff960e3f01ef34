"""Prefaulting a pull's mapped pages: page-aligned runs that never leave the tensors, threads
that finish, weights unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from registry import prefault
from registry.errors import SettingsError
from registry.settings import Settings


def test_runs_merge_spans_less_than_a_page_apart_and_align_to_pages() -> None:
    page = 4096
    spans = [(3 * page + 100, 3 * page + 200), (page + 10, 2 * page + 50),
             (2 * page + 60, 2 * page + 70), (9 * page, 9 * page), (20 * page + 1, 21 * page)]
    assert prefault.runs(spans, page) == [(page, page + 70), (3 * page, 200), (20 * page, page)]


def test_chunks_cover_each_run_in_order() -> None:
    assert prefault.chunks([(0, 10), (100, 4)], 4) == [(0, 4), (4, 4), (8, 2), (100, 4)]


def test_start_maps_a_loaded_file_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    tensors = {"a": torch.randn(300, 700), "b": torch.arange(10), "c": torch.randn(5)}
    save_file(tensors, str(path))
    loaded = load_file(str(path))
    jobs = prefault.start(loaded.values(), threads=3, chunk=64 * 1024)
    assert len(jobs) == 3
    for job in jobs:
        assert job.wait(timeout=30)
        assert job.held == []  # the map is let go once the job is over
    for key, tensor in tensors.items():
        assert torch.equal(loaded[key], tensor)


def test_no_thread_for_nothing_to_map() -> None:
    assert prefault.start([], threads=2) == []
    assert prefault.start([torch.ones(3)], threads=0) == []


def test_prefault_threads_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REGISTRY_PREFAULT_THREADS", raising=False)
    assert Settings.from_env().prefault_threads == 2
    monkeypatch.setenv("REGISTRY_PREFAULT_THREADS", "0")
    assert Settings.from_env().prefault_threads == 0
    monkeypatch.setenv("REGISTRY_PREFAULT_THREADS", "many")
    with pytest.raises(SettingsError, match="REGISTRY_PREFAULT_THREADS"):
        Settings.from_env()


def test_an_interpreter_exiting_mid_prefault_exits_cleanly(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(2048, 2048)}, str(path))
    code = ("from safetensors.torch import load_file\nfrom registry import prefault\n"
            f"prefault.start(load_file({str(path)!r}).values(), threads=2, chunk=4096)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_forked_child_starts_workers_of_its_own(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.randn(512, 512)}, str(path))
    code = (
        "import os\nfrom safetensors.torch import load_file\nfrom registry import prefault\n"
        f"t = load_file({str(path)!r})\n"
        "assert all(j.wait(30) for j in prefault.start(t.values(), threads=2, chunk=4096))\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    jobs = prefault.start(t.values(), threads=2, chunk=4096)\n"
        "    os._exit(0 if jobs and all(j.wait(30) for j in jobs) else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "raise SystemExit(os.waitstatus_to_exitcode(status))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
