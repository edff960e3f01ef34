"""A store on S3 or any S3-compatible service (MinIO, Ceph, moto), through boto3.

``s3://bucket/prefix`` holds the same layout as the file store (``blobs/sha256/<hex>``,
``manifests/<name>/v<N>.json``) under ``prefix``. boto3 is imported when a store is first used,
never by ``import registry``.

Uploads go through s3transfer's managed transfer: multipart with concurrent parts. Downloads are
ranged GETs of our own (store/ranged.py): concurrent parts written at their offsets into the
caller's temporary file, hashed in order on the calling thread as they land, one GET and no
thread for an object within one part. The caller (``BlobCache``) compares that digest with the
one recorded and only then renames the file into the cache.

Every botocore and s3transfer error is translated in one place, ``s3_errors.mapped_errors``;
messages name the endpoint, bucket and key, never credentials.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .._progress import transfer
from ..errors import NotFoundError, RefError, SettingsError, StoreUnavailableError
from ..io.parallel import DOWNLOAD_CONCURRENCY, UPLOAD_CONCURRENCY
from ..io.safewrite import open_emptied
from ..settings import DEFAULT_S3_CONCURRENCY, DEFAULT_S3_PART_SIZE
from . import ranged
from .base import Progress
from .layout import BLOBS, touched_key
from .retry import DEFAULT_RETRY_SECONDS, Backoff, T, Unreachable, retried
from .s3_errors import NO_BUCKET_CODES, Missing, error_code, mapped_errors, redact
from .sizes import check_size

DEFAULT_REGION = "us-east-1"
# Defaults: parts of 16 MiB, 8 in flight per object (REGISTRY_S3_PART_SIZE and
# REGISTRY_S3_CONCURRENCY change them; a download holds a 2 MiB buffer per part in flight).
PART_SIZE = DEFAULT_S3_PART_SIZE
CONCURRENCY = DEFAULT_S3_CONCURRENCY
MAX_ATTEMPTS = 4  # botocore's tries of one call; retry.py retries operations over a window
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
PRESIGN_EXPIRES_S = 3600
EMPTY_DIGEST = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class S3Store:
    """Objects under ``s3://bucket/prefix``; the boto3 client is created on first use."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, max_attempts: int | None = None,
                 part_size: int = PART_SIZE, concurrency: int = CONCURRENCY,
                 retry_seconds: float = DEFAULT_RETRY_SECONDS) -> None:
        self.bucket = bucket
        self.retry_seconds = retry_seconds
        self.part_size = part_size
        self.concurrency = concurrency
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or None
        self.region = region
        self.max_attempts = max_attempts
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._client: Any = None
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, endpoint_url: str | None = None,
                 max_attempts: int | None = None, *, part_size: int = PART_SIZE,
                 concurrency: int = CONCURRENCY,
                 retry_seconds: float = DEFAULT_RETRY_SECONDS) -> S3Store:
        """Parse ``s3://bucket[/prefix]``; ``endpoint_url`` points at MinIO or another service."""
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise SettingsError(f"store URL {url!r} names no bucket; use s3://bucket/prefix")
        bucket = parsed.netloc
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
            raise SettingsError(
                f"store URL {url!r} has bucket {bucket!r}, which is not a valid S3 bucket name; "
                "use 3-63 lowercase letters, digits, dots and hyphens"
            )
        if parsed.query or parsed.fragment or parsed.params:
            raise SettingsError(f"store URL {url!r} must not carry a query or fragment; "
                                "use s3://bucket/prefix")
        prefix = parsed.path.strip("/")
        if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
            raise SettingsError(f"store URL {url!r} has an invalid prefix {parsed.path!r}")
        if endpoint_url is not None:
            endpoint = urlparse(endpoint_url)
            if endpoint.scheme not in ("http", "https") or not endpoint.netloc:
                raise SettingsError(
                    f"S3 endpoint {redact(endpoint_url)!r} is not an http(s) URL; set "
                    "REGISTRY_S3_ENDPOINT_URL to e.g. http://localhost:9000"
                )
        return cls(bucket, prefix, endpoint_url=endpoint_url, max_attempts=max_attempts,
                   part_size=part_size, concurrency=concurrency, retry_seconds=retry_seconds)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint_url={self.where})"

    # -- the client -----------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """The boto3 S3 client (thread-safe once built; built once per store)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        import boto3
        from botocore.config import Config

        # A session of our own: boto3's default session is not safe to share across threads.
        session = boto3.session.Session()
        region = self.region or session.region_name or DEFAULT_REGION
        config = Config(
            region_name=region,
            # An explicit endpoint is MinIO or similar: bucket names go in the path, not the host.
            s3={"addressing_style": "path"} if self.endpoint_url else {},
            # Bounded retries with jittered backoff; AWS_MAX_ATTEMPTS, when set, is the bound.
            retries={"mode": "standard",
                     "total_max_attempts": self.max_attempts or MAX_ATTEMPTS},
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            # Every part of every file in flight at once gets a kept connection (a pull
            # fetches DOWNLOAD_CONCURRENCY shards side by side), so none is opened and dropped.
            max_pool_connections=self.concurrency * max(UPLOAD_CONCURRENCY,
                                                        DOWNLOAD_CONCURRENCY),
        )
        with mapped_errors(self):
            return session.client("s3", endpoint_url=self.endpoint_url, config=config)

    @property
    def where(self) -> str:
        """The endpoint, for messages (never credentials)."""
        if self.endpoint_url:
            return redact(self.endpoint_url)
        return redact(self._client.meta.endpoint_url) if self._client else "AWS S3"

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(
            multipart_threshold=self.part_size,
            multipart_chunksize=self.part_size,
            max_concurrency=self.concurrency,
            use_threads=True,
        )

    def _key(self, key: str) -> str:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or "\\" in key:
            raise RefError(f"invalid store key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- the ObjectStore protocol ---------------------------------------------------------

    def has(self, key: str) -> int | None:
        head = self._head(key)
        return None if head is None else int(head["ContentLength"])

    def _head(self, key: str) -> dict[str, Any] | None:
        """The object's HEAD answer, or None if there is no such object."""
        full = self._key(key)

        def head() -> dict[str, Any] | None:
            try:
                with mapped_errors(self, key, missing_ok=True):
                    return dict(self.client.head_object(Bucket=self.bucket, Key=full))
            except Missing:
                return None
        return self._retried(head)

    def etag(self, key: str) -> str | None:
        """The object's ETag (changes whenever its bytes are written), or None if it is absent."""
        return None if (head := self._head(key)) is None else str(head.get("ETag", ""))

    def put_file(self, key: str, path: Path, *, move: bool = False,
                 progress: Progress | None = None) -> None:
        """Upload with s3transfer: multipart with concurrent parts above the part size."""
        from boto3.s3.transfer import ProgressCallbackInvoker, create_transfer_manager

        full = self._key(key)
        size = os.path.getsize(path)
        with contextlib.ExitStack() as stack:
            if progress is None:
                progress = stack.enter_context(transfer(size, f"push {Path(key).name[:12]}"))
            shown = progress

            def upload() -> None:
                with mapped_errors(self, key), \
                        create_transfer_manager(self.client, self._transfer_config()) as manager:
                    future = manager.upload(str(path), self.bucket, full,
                                            subscribers=[ProgressCallbackInvoker(shown)])
                    future.result()
            self._retried(upload)
        if move:
            Path(path).unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        full = self._key(key)

        def put() -> None:
            with mapped_errors(self, key):
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data)
        self._retried(put)

    def get_bytes(self, key: str) -> bytes:
        full = self._key(key)

        def get() -> bytes:
            with mapped_errors(self, key):
                response = self.client.get_object(Bucket=self.bucket, Key=full)
                return bytes(response["Body"].read())
        return self._retried(get)

    def get_head(self, key: str, length: int) -> bytes:
        """The first ``length`` bytes of the object (a ranged GET)."""
        with mapped_errors(self, key):
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key),
                                              Range=f"bytes=0-{max(length, 1) - 1}")
            return bytes(response["Body"].read())[:length]

    def get_to_file(self, key: str, path: Path, *, progress: Progress | None = None,
                    size: int | None = None) -> str:
        """Ranged GETs into ``path`` (concurrent above the part size, each part written at its
        offset), hashed in order as the bytes land (store/ranged.py); returns the digest. With
        ``size`` (the manifest's), another size is refused before a byte is read, and no byte
        past it is asked for (store/sizes.py); without, the object's size is asked first."""
        from botocore.exceptions import HTTPClientError, IncompleteReadError

        full, what = self._key(key), f"object {key!r} in store {self.url} at {self.where}"
        if size is None:
            size = self.has(key)
            if size is None:
                raise NotFoundError(f"{what} not found")
        else:
            check_size(size, lambda: self.has(key), what)
        known: int = size

        def get(start: int, last: int) -> tuple[int, Any]:
            answer = self.client.get_object(Bucket=self.bucket, Key=full,
                                            Range=f"bytes={start}-{last}")
            return int(answer["ContentLength"]), answer["Body"]

        def download() -> str:  # each try starts the file again
            with open_emptied(path) as fh, mapped_errors(self, key):
                if not known:
                    return EMPTY_DIGEST
                return ranged.download(
                    fh.fileno(), known, get, part_size=self.part_size,
                    concurrency=self.concurrency, progress=progress, what=what,
                    # A broken stream (s3transfer's retryable download errors).
                    retryable=(HTTPClientError, IncompleteReadError, TimeoutError,
                               ConnectionError))
        return self._retried(download)

    def open_local(self, key: str) -> Path | None:
        self._key(key)
        return None

    def delete(self, key: str) -> None:
        full = self._key(key)

        def remove() -> None:
            with mapped_errors(self, key):
                self.client.delete_object(Bucket=self.bucket, Key=full)
                if key.startswith(BLOBS):
                    self.client.delete_object(Bucket=self.bucket, Key=self._key(touched_key(key)))
        self._retried(remove)

    def list(self, prefix: str) -> Iterator[str]:
        # Directory semantics, as in the file store: "manifests/m1" must not match "m10".
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        base = f"{self.prefix}/" if self.prefix else ""
        after: str | None = None  # the last key yielded: a retry resumes after it
        backoff = Backoff(self.retry_seconds, f"store {self.url} at {self.where}")
        while True:
            try:
                with mapped_errors(self):
                    extra = {"StartAfter": base + after} if after is not None else {}
                    pages = self.client.get_paginator("list_objects_v2").paginate(
                        Bucket=self.bucket, Prefix=base + prefix, **extra)
                    for page in pages:
                        for item in page.get("Contents", ()):
                            after = item["Key"][len(base):]
                            yield after
                return
            except Unreachable as exc:
                backoff.wait_or_raise(exc)

    def modified(self, key: str) -> datetime | None:
        """The later of the object's LastModified and its touch marker's."""
        written = self._last_modified(key)
        if written is None:
            return None
        touched = self._last_modified(touched_key(key))
        return max(written, touched) if touched is not None else written

    def touch(self, key: str) -> None:
        """Write an empty marker ``touched/sha256/<hex>``: S3 has no utime, and copying a multi-GB
        blob onto itself is slow where it refreshes LastModified at all (s3rver keeps it)."""
        if self.has(key) is not None:
            self.put_bytes(touched_key(key), b"")

    def _last_modified(self, key: str) -> datetime | None:
        head = self._head(key)
        if head is None:
            return None
        moment: datetime = head["LastModified"]
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def presign(self, key: str, method: str, *, expires_s: int = PRESIGN_EXPIRES_S) -> str:
        """A time-limited URL to GET or PUT ``key`` without credentials (the server hands these
        out so bytes go straight between clients and S3). A PUT must send
        ``Content-Type: application/octet-stream``, which the signature covers."""
        operations = {"GET": "get_object", "PUT": "put_object"}
        if method not in operations:
            raise ValueError(f"cannot presign {method!r}; use GET or PUT")
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if method == "PUT":
            params["ContentType"] = "application/octet-stream"
        with mapped_errors(self, key):
            return str(self.client.generate_presigned_url(
                operations[method], Params=params, ExpiresIn=expires_s))

    # -- administration -------------------------------------------------------------------

    def create_bucket(self) -> bool:
        """Create the bucket (``registry store init``); False when it already exists."""
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        region = self.client.meta.region_name
        if region and region != DEFAULT_REGION:
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        with mapped_errors(self, bucket_op=True):
            try:
                self.client.head_bucket(Bucket=self.bucket)
                return False
            except ClientError as exc:
                if error_code(exc) not in NO_BUCKET_CODES:
                    raise
            try:
                self.client.create_bucket(**kwargs)
            except ClientError as exc:
                if error_code(exc) == "BucketAlreadyOwnedByYou":
                    return False
                if error_code(exc) == "BucketAlreadyExists":
                    raise StoreUnavailableError(
                        f"bucket {self.bucket!r} already exists and belongs to another account "
                        f"at {self.where}; choose another bucket in REGISTRY_STORE_URL"
                    ) from None
                raise
        return True

    # -- retries -------------------------------------------------------------------------

    def _retried(self, attempt: Callable[[], T]) -> T:
        return retried(attempt, self.retry_seconds, f"store {self.url} at {self.where}")
