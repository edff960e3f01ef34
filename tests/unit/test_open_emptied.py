"""io/safewrite.py's open_emptied: a download's temporary file, open and empty, whether it was
absent, empty (mkstemp's) or held a failed try's bytes."""

from __future__ import annotations

from pathlib import Path

from registry.io.safewrite import open_emptied


def test_a_file_that_held_bytes_is_emptied_and_written_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "partial"
    path.write_bytes(b"a failed try's bytes")
    with open_emptied(path) as fh:
        assert fh.read() == b""
        fh.write(b"new")
        fh.seek(0)
        assert fh.read() == b"new"
    assert path.read_bytes() == b"new"


def test_an_absent_file_is_created_and_an_empty_one_kept(tmp_path: Path) -> None:
    absent, empty = tmp_path / "absent", tmp_path / "empty"
    empty.touch()
    inode = empty.stat().st_ino
    for path in (absent, empty):
        with open_emptied(path) as fh:
            fh.write(b"x")
    assert absent.read_bytes() == empty.read_bytes() == b"x"
    assert empty.stat().st_ino == inode  # the same file, written in place
