"""Downloads bounded by the size a manifest lists: an object of another size is refused before a
byte of it is read, and no byte past that size is taken, so a store object that grew (a writer
of the bucket, a hostile upload) can make a pull neither read nor write more than the manifest
says. Used by :meth:`registry.store.s3.S3Store.get_to_file`, whose ranged GETs then ask for
exactly those bytes (store/ranged.py refuses an answer longer or shorter than its range), and by
the file store."""

from __future__ import annotations

from collections.abc import Callable

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
