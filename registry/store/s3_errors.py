"""S3's failures as registry errors: every botocore and s3transfer error is translated here, once.

:func:`mapped_errors` wraps each call ``S3Store`` makes. A missing key becomes ``NotFoundError``
(or :class:`Missing`, for a caller that only asks whether it is there), a missing bucket a
``StoreUnavailableError`` that says to run ``registry store init`` (a bare HEAD 404 is told
apart from a missing key by asking for the bucket), refused credentials and unreachable endpoints
say what to check, and transient codes become ``retry.Unreachable`` so ``retry.py`` tries the
operation again. Messages name the endpoint, bucket and key, never credentials (:func:`redact`).
boto3 is imported only inside these functions, as in ``s3.py``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, Protocol

from ..errors import NotFoundError, StoreUnavailableError
from .retry import TRANSIENT_CODES, Unreachable

MISSING_KEY_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
NO_BUCKET_CODES = frozenset({"404", "NoSuchBucket", "NotFound"})
DENIED_CODES = frozenset({"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                          "ExpiredToken", "InvalidToken", "AllAccessDisabled"})


class S3Place(Protocol):
    """Where a call went, for messages and for the bucket check (``S3Store`` is one)."""

    @property
    def bucket(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def where(self) -> str: ...

    @property
    def client(self) -> Any: ...


class Missing(Exception):
    """A key that is not there, for callers that passed ``missing_ok`` (``S3Store.has``)."""


@contextlib.contextmanager
def mapped_errors(place: S3Place, key: str | None = None, *, missing_ok: bool = False,
                  bucket_op: bool = False) -> Iterator[None]:
    """Translate botocore and s3transfer errors raised inside into registry errors, once.
    ``bucket_op``: the call is about the bucket itself, so a 404 is not a missing key."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        CredentialRetrievalError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from s3transfer.exceptions import RetriesExceededError

    try:
        yield
    except ClientError as exc:
        code = error_code(exc)
        if code == "NoSuchBucket":
            raise no_bucket(place) from None
        if code in MISSING_KEY_CODES and not bucket_op:
            # HEAD answers a bare 404 for a missing bucket too: tell the two apart.
            if not bucket_exists(place.client, place.bucket):
                raise no_bucket(place) from None
            if missing_ok:
                raise Missing() from None
            raise NotFoundError(
                f"object {key!r} not found in store {place.url} at {place.where}"
            ) from None
        if code in DENIED_CODES:
            raise StoreUnavailableError(
                f"store {place.url} at {place.where} refused the request ({code}); check the "
                "AWS credentials and the bucket policy"
            ) from None
        raise (Unreachable if code in TRANSIENT_CODES else StoreUnavailableError)(
            f"store {place.url} at {place.where} failed"
            + (f" on {key!r}" if key else "") + f": {code}"
        ) from None
    except (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError):
        raise StoreUnavailableError(
            f"no usable AWS credentials for store {place.url}; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        ) from None
    except (ConnectionError, HTTPClientError, RetriesExceededError) as exc:
        raise Unreachable(
            f"store {place.url} at {place.where} is unreachable ({type(exc).__name__}); check "
            "that the endpoint is up and REGISTRY_S3_ENDPOINT_URL is right"
        ) from None
    except BotoCoreError as exc:
        raise StoreUnavailableError(
            f"store {place.url} at {place.where} failed ({type(exc).__name__}); check the S3 "
            "settings (REGISTRY_STORE_URL, REGISTRY_S3_ENDPOINT_URL, AWS_REGION)"
        ) from None


def bucket_exists(client: Any, bucket: str) -> bool:
    """False only when S3 says the bucket is not there (any other failure: cannot tell)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if error_code(exc) in NO_BUCKET_CODES:
            return False
    except BotoCoreError:
        pass  # cannot tell; the caller reports the error it already has
    return True


def no_bucket(place: S3Place) -> StoreUnavailableError:
    """The error for a bucket that does not exist, with the command that creates it."""
    return StoreUnavailableError(
        f"bucket {place.bucket!r} does not exist at {place.where}; create it with "
        "`registry store init` (or fix REGISTRY_STORE_URL)"
    )


def error_code(exc: Any) -> str:
    """The S3 error code of a botocore ``ClientError``, else its HTTP status."""
    return str(exc.response.get("Error", {}).get("Code", "")) or str(
        exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "unknown"))


def redact(url: str) -> str:
    """``url`` with any user:password@ replaced by ``***@``."""
    return re.sub(r"(://)[^/@]*@", r"\1***@", url)
