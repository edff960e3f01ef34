"""Readahead of a pull's shard files: the right ranges, every fd closed, errors never fatal."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import registry
from registry import readahead
from registry.errors import SettingsError
from registry.settings import Settings


def _file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_plan_covers_every_byte_of_every_file_in_chunks(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    ranges = readahead.plan([(a, 10), (b, 4), (tmp_path / "empty", 0)], chunk=4)
    assert ranges == [(a, 0, 4), (a, 4, 4), (a, 8, 2), (b, 0, 4)]
    with pytest.raises(ValueError):
        readahead.plan([(a, 10)], chunk=0)


def test_threads_advise_exactly_the_planned_ranges_and_close_their_fds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _file(tmp_path / "a", 10_000), _file(tmp_path / "b", 3_000)
    seen: list[tuple[str, int, int]] = []
    lock = threading.Lock()
    opened: list[int] = []
    real_open = os.open

    def advise(fd: int, offset: int, length: int) -> None:
        with lock:
            seen.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))

    def track(path: object, flags: int, *args: object) -> int:
        fd = real_open(path, flags, *args)  # type: ignore[arg-type]
        with lock:
            opened.append(fd)
        return fd

    monkeypatch.setattr(readahead, "advise", advise)
    monkeypatch.setattr(readahead.os, "open", track)
    work = readahead.Readahead([(a, 10_000), (b, 3_000)], threads=3, chunk=4096).start()
    work.wait()
    assert sorted(seen) == sorted((str(p.resolve()), o, n) for p, o, n in work.ranges)
    assert len(work.ranges) == 4 and not work.errors
    for fd in opened:  # every descriptor the threads opened is closed again
        with pytest.raises(OSError):
            os.fstat(fd)


def test_missing_files_and_failing_advice_are_recorded_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(fd: int, offset: int, length: int) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(readahead, "advise", fail)
    work = readahead.Readahead([(tmp_path / "gone", 100), (_file(tmp_path / "x", 10), 10)],
                               threads=2).start()
    work.wait()
    assert len(work.errors) == 2


def test_really_advises_the_kernel(tmp_path: Path) -> None:
    path = _file(tmp_path / "w", 3 * 2**20)
    work = readahead.Readahead([(path, 3 * 2**20)], threads=2, chunk=2**20).start()
    work.wait()
    assert work.errors == []


def test_a_pull_with_readahead_returns_the_same_weights_even_when_it_fails(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    calls: list[tuple[int, int]] = []
    monkeypatch.setenv("REGISTRY_READAHEAD_THREADS", "2")
    monkeypatch.setattr(readahead, "advise", lambda fd, off, n: calls.append((off, n)))
    reg = registry.Registry(home=home)
    try:
        mv = reg.push(net, "ra")
        pulled = reg.pull(str(mv), model=lambda: nn.Sequential(nn.Linear(64, 64),
                                                                nn.Linear(64, 8)))
        blobs = (home / "objects").rglob("*")
        stored = sum(p.stat().st_size for p in blobs if p.is_file() and p.stat().st_size > 4096)
        assert sum(n for _, n in calls) == stored  # the whole shard was asked for
        for key, value in net.state_dict().items():
            assert torch.equal(pulled.state_dict()[key], value)

        def broken(fd: int, offset: int, length: int) -> None:
            raise OSError(5, "I/O error")

        monkeypatch.setattr(readahead, "advise", broken)
        state = reg.pull_state_dict(str(mv), device="cpu")
        assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    finally:
        reg.close()


def test_readahead_threads_setting() -> None:
    assert Settings.from_env({}).readahead_threads == 0
    assert Settings.from_env({"REGISTRY_READAHEAD_THREADS": "4"}).readahead_threads == 4
    with pytest.raises(SettingsError, match="REGISTRY_READAHEAD_THREADS"):
        Settings.from_env({"REGISTRY_READAHEAD_THREADS": "many"})
