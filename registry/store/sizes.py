"""Downloads bounded by the size a manifest lists: an object of another size is refused before a
byte of it is read, and no byte past that size is taken, so a store object that grew (a writer
of the bucket, a hostile upload) can make a pull neither read nor write more than the manifest
says. Used by :meth:`registry.store.s3.S3Store.get_to_file` (s3transfer is told the size, so it
asks for exactly those bytes and skips its own HEAD)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..digests import HashingWriter
from ..errors import DigestMismatchError, NotFoundError


def check_size(size: int | None, stored: Callable[[], int | None], what: str) -> None:
    """Raise unless ``stored()`` (the object's length, None if absent) is ``size``; nothing is
    asked without a size."""
    if size is None:
        return
    found = stored()
    if found is None:
        raise NotFoundError(f"{what} not found")
    if found != size:
        raise DigestMismatchError(f"{what} holds {found} bytes where its manifest lists {size}; "
                                  "it was not downloaded. Push the same weights again to repair it")


def known_size(size: int | None, stored: Callable[[], int | None], what: str) -> list[Any]:
    """The s3transfer subscribers of a download of ``size`` bytes (none without a size), once
    :func:`check_size` passed."""
    check_size(size, stored, what)
    return [] if size is None else [KnownSize(size)]


class KnownSize:
    """An s3transfer subscriber that gives the transfer its size: only ``size`` bytes are asked
    for (in ranged parts above the part size) and no HEAD is made."""

    def __init__(self, size: int) -> None:
        self.size = size

    def on_queued(self, future: Any, **_kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.size)


class BoundedWriter(HashingWriter):
    """A :class:`HashingWriter` that refuses a byte past ``size`` (when given): an object
    replaced by a larger one between the size check and the GET, fetched whole below the part
    size, is cut off there."""

    def __init__(self, fh: Any, size: int | None, what: str) -> None:
        super().__init__(fh)
        self.size, self.what = size, what

    def write(self, data: bytes | memoryview) -> int:
        if self.size is not None and self.written + memoryview(data).nbytes > self.size:
            raise DigestMismatchError(f"{self.what} sent more than the {self.size} bytes its "
                                      "manifest lists; it was discarded")
        return super().write(data)
