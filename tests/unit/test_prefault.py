"""Prefaulting a pull's mapped pages: page-aligned runs that never leave the tensors, threads
that finish, weights unchanged."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from registry.errors import SettingsError
from registry.io import prefault
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


def _mapped(path: Path) -> torch.Tensor:
    """The file's bytes as a tensor on a private map, as a pull maps a shard (safetensors'
    load_file would read them into the page cache first)."""
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapped, dtype=torch.uint8)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise to evict")
def test_a_file_out_of_the_page_cache_is_mapped_by_one_worker(tmp_path: Path) -> None:
    """Cold, one worker reads front to back (the kernel's readahead sees one stream); warm,
    the workers asked for share the mapping."""
    path = tmp_path / "w.bin"
    path.write_bytes(os.urandom(16 * 2**20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # clean pages can be evicted
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    cold = _mapped(path)
    jobs = prefault.start([cold], threads=2, chunk=2**20)
    assert len(jobs) == 1
    assert all(job.wait(timeout=30) for job in jobs)
    warm = _mapped(path)
    jobs = prefault.start([warm], threads=2, chunk=2**20)
    assert len(jobs) == 2, "the first job read every page in: the file is warm now"
    assert all(job.wait(timeout=30) for job in jobs)
    assert torch.equal(cold, warm)
    assert cold.numpy().tobytes() == path.read_bytes()


def test_a_held_block_starts_its_jobs_when_it_ends_well(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An adapter's pull holds its base's prefault until PEFT has attached the adapter; a
    failed block starts nothing; a nested block leaves the starting to the outermost."""
    started: list[list[torch.Tensor]] = []
    monkeypatch.setattr(prefault, "start", lambda tensors, threads=1: started.append(
        list(tensors)))
    a, b = torch.ones(3), torch.zeros(2)
    with prefault.held():
        prefault.start_after([a], 2)
        with prefault.held():
            prefault.start_after([b], 2)
        assert started == []
    assert [[t is a for t in started[0]], [t is b for t in started[1]]] == [[True], [True]]
    started.clear()
    with pytest.raises(RuntimeError), prefault.held():
        prefault.start_after([a], 2)
        raise RuntimeError("the attach failed")
    prefault.start_after([b], 2)  # outside any block: at once
    assert len(started) == 1 and started[0][0] is b


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
    code = ("from safetensors.torch import load_file\nfrom registry.io import prefault\n"
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
        "import os\nfrom safetensors.torch import load_file\nfrom registry.io import prefault\n"
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
