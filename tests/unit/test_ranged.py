"""registry/store/ranged.py: an object fetched by ranged GETs lands whole at its offsets, hashed
in order; a broken stream resumes where it stopped; a wrong answer is refused; a failed part
stops the others before the download returns."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from registry.errors import DigestMismatchError, StoreUnavailableError
from registry.store import ranged

MiB = 2**20


class Broken(Exception):
    """A stream that broke (what botocore raises for a cut connection)."""


class Body(io.RawIOBase):
    """An answer's body: ``data``, breaking with :class:`Broken` after ``break_after`` bytes."""

    def __init__(self, data: bytes, break_after: int | None = None) -> None:
        self.stream = io.BytesIO(data)
        self.break_after = break_after
        self.closed_by_reader = False

    def readinto(self, b: Any) -> int:
        if self.break_after is not None and self.stream.tell() >= self.break_after:
            raise Broken()
        view = memoryview(b)
        if self.break_after is not None:
            view = view[:self.break_after - self.stream.tell()]
        return self.stream.readinto(view)

    def close(self) -> None:
        self.closed_by_reader = True


class Store:
    """Answers ranged GETs of ``data``; ``answer`` may change what a range gets."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked: list[tuple[int, int]] = []
        self.bodies: list[Body] = []
        self.lock = threading.Lock()

    def answer(self, start: int, last: int) -> tuple[int, Body]:
        return last - start + 1, Body(self.data[start:last + 1])

    def get(self, start: int, last: int) -> tuple[int, Body]:
        with self.lock:
            self.asked.append((start, last))
        announced, body = self.answer(start, last)
        with self.lock:
            self.bodies.append(body)
        return announced, body


def _slow_sha(delay: float) -> Any:
    """A sha256 that waits ``delay`` seconds per update, so the parts' threads outrun the
    hashing and lent blocks wait to be hashed."""
    real = hashlib.sha256

    class SlowSha:
        def __init__(self) -> None:
            self.sha = real()

        def update(self, chunk: Any) -> None:
            threading.Event().wait(delay)
            self.sha.update(chunk)

        def hexdigest(self) -> str:
            return self.sha.hexdigest()

    return SlowSha


def _download(store: Store, path: Path, size: int, part: int = MiB,
              concurrency: int = 4) -> str:
    with open(path, "w+b", buffering=0) as fh:
        return ranged.download(fh.fileno(), size, store.get, part_size=part,
                               concurrency=concurrency, retryable=(Broken,), what="object x")


@pytest.mark.parametrize("size", [1, MiB - 1, MiB, MiB + 1, 5 * MiB + 12345])
def test_every_byte_lands_at_its_offset_hashed_in_order(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    store = Store(data)
    digest = _download(store, tmp_path / "f", size)
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert (tmp_path / "f").read_bytes() == data
    parts = -(-size // MiB)
    assert sorted(store.asked) == [(i * MiB, min(size, (i + 1) * MiB) - 1) for i in range(parts)]
    assert all(b.closed_by_reader for b in store.bodies)


def test_a_part_size_off_the_block_size_still_writes_every_byte(tmp_path: Path) -> None:
    size = 11 * MiB + 7
    data = os.urandom(size)
    store = Store(data)
    assert _download(store, tmp_path / "f", size, part=3 * MiB + 1, concurrency=3) == \
        "sha256:" + hashlib.sha256(data).hexdigest()
    assert (tmp_path / "f").read_bytes() == data


def test_parts_arriving_out_of_order_are_hashed_in_order(tmp_path: Path) -> None:
    size = 4 * MiB
    data = os.urandom(size)
    first_part_may_go = threading.Event()

    class Late(Store):
        def answer(self, start: int, last: int) -> tuple[int, Body]:
            if start == 0:
                first_part_may_go.wait(30)  # the later parts are all written before it
            elif len([a for a in self.asked if a[0] != 0]) == 3:
                first_part_may_go.set()
            return super().answer(start, last)

    store = Late(data)
    assert _download(store, tmp_path / "f", size) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert first_part_may_go.is_set()


@pytest.mark.parametrize("size", [3 * MiB + 5, 7 * MiB])  # one part; two
def test_a_broken_stream_resumes_after_its_last_whole_block(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    part = 4 * MiB

    class Breaking(Store):
        def answer(self, start: int, last: int) -> tuple[int, Body]:
            # Each part's first answer breaks 1000 bytes into its second block.
            cut = ranged.BLOCK + 1000 if start % part == 0 else None
            return last - start + 1, Body(self.data[start:last + 1], break_after=cut)

    store = Breaking(data)
    assert _download(store, tmp_path / "f", size, part=part) == \
        "sha256:" + hashlib.sha256(data).hexdigest()
    assert (tmp_path / "f").read_bytes() == data
    starts = range(0, size, part)
    # Asked again from the end of the block written whole, to the part's end: nothing twice
    # but the broken block.
    assert sorted(store.asked) == sorted(
        [(s, min(size, s + part) - 1) for s in starts]
        + [(s + ranged.BLOCK, min(size, s + part) - 1) for s in starts])


def test_a_stream_that_keeps_breaking_is_unreachable(tmp_path: Path) -> None:
    data = os.urandom(1000)

    class Dead(Store):
        def answer(self, start: int, last: int) -> tuple[int, Body]:
            return last - start + 1, Body(data[start:last + 1], break_after=0)

    store = Dead(data)
    with pytest.raises(StoreUnavailableError, match=r"object x: .* broke 5 times \(Broken\)"):
        _download(store, tmp_path / "f", 1000)
    assert len(store.asked) == ranged.PART_ATTEMPTS


@pytest.mark.parametrize("announced, sent", [(MiB + 1, None), (MiB - 1, None),
                                             (MiB, MiB - 10)])
def test_an_answer_of_another_length_is_refused(tmp_path: Path, announced: int,
                                                sent: int | None) -> None:
    data = os.urandom(3 * MiB)

    class Wrong(Store):
        def answer(self, start: int, last: int) -> tuple[int, Body]:
            if start == MiB:
                return announced, Body(self.data[start:start + (sent or announced)])
            return super().answer(start, last)

    store = Wrong(data)
    with pytest.raises(DigestMismatchError, match="object x: the store"):
        _download(store, tmp_path / "f", len(data))


def test_a_failed_part_stops_the_others_before_the_download_returns(tmp_path: Path) -> None:
    data = os.urandom(8 * MiB)
    started = threading.Event()

    class Failing(Store):
        def answer(self, start: int, last: int) -> tuple[int, Body]:
            if start == MiB:
                started.wait(30)
                return 1, Body(b"x")  # refused: a wrong length
            if start == 0:
                started.set()
            return super().answer(start, last)

    store = Failing(data)
    with pytest.raises(DigestMismatchError, match="answered 1 bytes for bytes"):
        _download(store, tmp_path / "f", len(data), concurrency=2)
    assert started.is_set()
    # Every part's thread has ended (nothing writes the file once the download returned), and
    # every answer taken was closed.
    assert not [t for t in threading.enumerate() if t.name == "registry-s3-part"]
    assert all(b.closed_by_reader for b in store.bodies)


def test_a_block_lent_to_be_hashed_is_not_overwritten_before_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(8 * MiB + 3)
    expected = "sha256:" + hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(ranged.hashlib, "sha256", _slow_sha(0.005))
    store = Store(data)
    assert _download(store, tmp_path / "f", len(data), part=4 * MiB, concurrency=2) == expected
    assert (tmp_path / "f").read_bytes() == data


def test_blocks_are_kept_between_downloads_and_never_shared_while_in_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads take their buffers from one bounded free list (a new 2 MiB buffer faults its
    pages in): a second download makes no new buffer, and downloads running at once, their
    hashing slowed so that lent blocks wait, each get their own bytes and digest."""
    blocks = ranged._Blocks(ranged.KEPT_BLOCKS)
    monkeypatch.setattr(ranged, "_BLOCKS", blocks)
    made: list[int] = []
    take = blocks.take

    def counting() -> memoryview:
        before = len(blocks.free)
        block = take()
        made.extend([1] if before == 0 else [])
        return block

    monkeypatch.setattr(blocks, "take", counting)
    small = os.urandom(MiB + 5)  # one part: one buffer, handed back when it is done
    for name in ("one", "two"):
        _download(Store(small), tmp_path / name, len(small), part=2 * MiB)
    assert len(made) == 1
    # Parts side by side: how many buffers a download holds at once depends on the timing, but
    # later downloads take them from the list rather than making as many again.
    data = os.urandom(5 * MiB + 7)
    _download(Store(data), tmp_path / "warm", len(data), part=2 * MiB, concurrency=2)
    first = len(made)
    for i in range(4):
        assert _download(Store(data), tmp_path / f"again{i}", len(data), part=2 * MiB,
                         concurrency=2) == "sha256:" + hashlib.sha256(data).hexdigest()
    assert len(made) - first <= first - 1
    assert 0 < len(blocks.free) <= ranged.KEPT_BLOCKS

    real = hashlib.sha256
    monkeypatch.setattr(ranged.hashlib, "sha256", _slow_sha(0.002))
    payloads = [os.urandom(7 * MiB + i) for i in range(6)]
    got: dict[int, str] = {}

    def one(i: int) -> None:
        got[i] = _download(Store(payloads[i]), tmp_path / f"p{i}", len(payloads[i]),
                           part=2 * MiB, concurrency=3)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, data in enumerate(payloads):
        assert got[i] == "sha256:" + real(data).hexdigest()
        assert (tmp_path / f"p{i}").read_bytes() == data
    assert len(blocks.free) <= ranged.KEPT_BLOCKS
