"""Digests: checked before they become paths or keys; the version digest of several shards."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from registry import manifest as mf
from registry.caching.cache import BlobCache
from registry.errors import RefError
from registry.io import digests
from registry.io.digests import BLOCK, HashingWriter, check_digest, sha256_file, version_digest

GOOD = "sha256:" + "ab" * 32


@pytest.mark.parametrize("bad", [
    "sha256:../../../../victim", "sha256:" + "AB" * 32, "sha256:" + "ab" * 31, "md5:" + "ab" * 16,
    GOOD + "\n", "", None, 7, "sha256:" + "a" * 10_000,
])
def test_malformed_digests_never_become_paths_or_keys(bad: object, tmp_path: Path) -> None:
    with pytest.raises(RefError, match="expected 'sha256:' followed by 64 lowercase hex"):
        check_digest(bad)
    with pytest.raises(RefError):
        BlobCache(tmp_path).path(bad)  # type: ignore[arg-type]
    with pytest.raises(RefError):
        mf.blob_key(bad)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_long_bad_digest_is_quoted_short() -> None:
    with pytest.raises(RefError) as info:
        check_digest("sha256:" + "z" * 5000)
    assert len(str(info.value)) < 250


def test_good_digests_pass_and_address_the_cache(tmp_path: Path) -> None:
    assert check_digest(GOOD) == GOOD
    assert BlobCache(tmp_path).path(GOOD) == tmp_path / "blobs" / "sha256" / ("ab" * 32)
    assert mf.blob_key(GOOD) == f"blobs/sha256/{'ab' * 32}"


def test_version_digest_of_one_and_several_shards(tmp_path: Path) -> None:
    other = "sha256:" + "cd" * 32
    assert version_digest([GOOD]) == GOOD
    canonical = json.dumps([GOOD, other], separators=(",", ":")).encode()
    assert version_digest([GOOD, other]) == "sha256:" + hashlib.sha256(canonical).hexdigest()
    assert version_digest([other, GOOD]) != version_digest([GOOD, other])
    with pytest.raises(RefError):
        version_digest([GOOD, "sha256:nope"])
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    assert sha256_file(path) == "sha256:" + hashlib.sha256(b"x" * 10).hexdigest()


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """``(offset, length)`` of every write the writer makes (it writes with ``os.writev``)."""
    seen: list[tuple[int, int]] = []
    real = os.writev

    def recorded(fd: int, buffers: list[memoryview]) -> int:
        at = os.lseek(fd, 0, os.SEEK_CUR)
        done = real(fd, buffers)
        seen.append((at, done))
        return done

    monkeypatch.setattr(digests.os, "writev", recorded)
    return seen


def test_a_hashing_writer_writes_whole_aligned_blocks_and_the_tail_at_close(
        tmp_path: Path, writes: list[tuple[int, int]]) -> None:
    """Small and odd-sized pieces reach the file as 8 MiB writes at 8 MiB offsets (what makes
    the kernel keep it in 2 MiB folios); big pieces go on without a copy; the bytes and the
    digest are those given."""
    data = os.urandom(3 * BLOCK + 12_345)
    sizes = [7, 256 * 1024, 1, BLOCK + 5, 2 * 2**20, 3]
    pieces: list[bytes | memoryview] = []
    at = 0
    for size in sizes:
        pieces.append(data[at:at + size])
        at += size
    buffer = bytearray(data[at:])  # a buffer its owner may reuse: what is held is a copy
    pieces.append(memoryview(buffer))
    path = tmp_path / "out"
    with open(path, "wb", buffering=0) as fh, HashingWriter(fh) as out:
        for piece in pieces:
            assert out.write(piece) == len(piece)
        buffer[-12_345:] = bytes(12_345)  # reused before the tail was written
        assert out.written == len(data)
        assert path.stat().st_size == 3 * BLOCK, "the tail is held until close"
        with pytest.raises(RuntimeError, match="before close"):
            out.digest()  # a digest of bytes the file lacks would be a lie
    assert path.read_bytes() == data
    assert out.digest() == "sha256:" + hashlib.sha256(data).hexdigest()
    assert writes == [(0, BLOCK), (BLOCK, BLOCK), (2 * BLOCK, BLOCK), (3 * BLOCK, 12_345)]


@pytest.mark.parametrize("expected", [3 * BLOCK + 12_345, 100_000])
def test_a_gathering_writer_copies_pieces_into_one_buffer_and_writes_aligned_blocks(
        tmp_path: Path, writes: list[tuple[int, int]], expected: int) -> None:
    """``gather=``: what an HTTP body's 64 KiB reads go through. Every piece is copied into one
    buffer (a piece's owner may reuse it at once), blocks still reach the file whole at
    aligned offsets, and a buffer sized for a smaller stream than arrives still writes it all
    (the caller bounds the stream; this writer never loses a byte)."""
    data = os.urandom(3 * BLOCK + 12_345)
    path = tmp_path / "out"
    reused = bytearray(64 * 1024)
    with open(path, "wb", buffering=0) as fh, HashingWriter(fh, gather=expected) as out:
        for at in range(0, len(data), len(reused)):
            piece = data[at:at + len(reused)]
            reused[:len(piece)] = piece
            assert out.write(memoryview(reused)[:len(piece)]) == len(piece)
            reused[:] = bytes(len(reused))  # the owner reuses it before any block is full
        assert out.written == len(data)
        with pytest.raises(RuntimeError, match="before close"):
            out.digest()
    assert path.read_bytes() == data
    assert out.digest() == "sha256:" + hashlib.sha256(data).hexdigest()
    if expected > BLOCK:
        assert writes == [(0, BLOCK), (BLOCK, BLOCK), (2 * BLOCK, BLOCK), (3 * BLOCK, 12_345)]
    else:  # the buffer holds 100,000 bytes: written each time it fills
        assert sum(n for _, n in writes) == len(data) and max(n for _, n in writes) == expected


def test_a_hashing_writer_on_a_file_opened_mid_block_ends_its_first_write_at_the_boundary(
        tmp_path: Path, writes: list[tuple[int, int]]) -> None:
    path = tmp_path / "out"
    data = os.urandom(2 * BLOCK)
    with open(path, "wb") as fh:  # buffered: its own bytes reach the file first
        fh.write(b"x" * 1000)
        with HashingWriter(fh) as out:
            out.write(data)
    assert writes == [(1000, BLOCK - 1000 + BLOCK), (2 * BLOCK, 1000)]
    assert path.read_bytes() == b"x" * 1000 + data


def test_a_hashing_writer_left_by_an_error_writes_nothing_more(tmp_path: Path) -> None:
    path = tmp_path / "out"
    with pytest.raises(RuntimeError), open(path, "wb", buffering=0) as fh, \
            HashingWriter(fh) as out:
        out.write(b"held")
        raise RuntimeError("the download broke")
    assert path.read_bytes() == b""


def test_a_hashing_writer_joins_many_small_pieces_before_writev_refuses_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """writev takes at most IOV_MAX pieces (EINVAL beyond): 20,000 pieces of 1 KiB, as a shard
    of many small tensors or a body read in small chunks gives, still land whole and aligned."""
    counts: list[int] = []
    real = os.writev

    def counted(fd: int, buffers: list[memoryview]) -> int:
        counts.append(len(buffers))
        return real(fd, buffers)

    monkeypatch.setattr(digests.os, "writev", counted)
    pieces = [bytes([i % 251]) * 1024 for i in range(20_000)]
    path = tmp_path / "many"
    with path.open("wb") as fh, HashingWriter(fh) as out:
        for piece in pieces:
            out.write(piece)
    data = b"".join(pieces)
    assert path.read_bytes() == data
    assert out.digest() == "sha256:" + hashlib.sha256(data).hexdigest()
    assert len(counts) == 3 and max(counts) <= digests.IOV_MAX  # two whole blocks and the tail


def test_a_hashing_writer_finishes_a_short_writev(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """writev may write less than it was given (a signal, a pipe, a full disk's last bytes):
    the writer goes on from the first byte not written, mid-piece included."""
    real = os.writev
    calls = 0

    def short(fd: int, buffers: list[memoryview]) -> int:
        nonlocal calls
        calls += 1
        budget, taken = 1_000_003, []  # an odd amount, so cuts fall inside pieces
        for b in buffers:
            if budget <= 0:
                break
            taken.append(b[:budget])
            budget -= len(taken[-1])
        return real(fd, taken)

    monkeypatch.setattr(digests.os, "writev", short)
    data = os.urandom(BLOCK + 5_000_000)
    path = tmp_path / "short"
    with path.open("wb") as fh, HashingWriter(fh) as out:
        for at in range(0, len(data), 300_001):
            out.write(data[at:at + 300_001])
    assert path.read_bytes() == data
    assert out.digest() == "sha256:" + hashlib.sha256(data).hexdigest()
    assert calls > len(data) // 1_000_003
