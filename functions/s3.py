"""The object store on S3 (or an S3-compatible server: MinIO, moto): ``s3://bucket/prefix``.

:class:`S3ObjectStore` keeps each key as the S3 object ``<prefix>/<key>`` in one bucket,
so several stores (a deployment, a test run) can share a bucket under different prefixes
without seeing each other's objects. It implements :class:`functions.objectstore.ObjectStore`
with boto3 only, so a Lambda worker (whose runtime ships boto3) can use it, and
:func:`functions.objectstore.open_object_store` returns it for ``s3://`` URLs.

Where the server is
-------------------
The ``endpoint_url`` argument, else the ``DRIFTLINE_S3_ENDPOINT_URL`` environment variable,
else boto3's own configuration (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the config
file), else AWS. Credentials and the region come from boto3's usual chain
(``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, a profile, an instance or Lambda role); with a
custom endpoint and no region configured the region is ``us-east-1``, and requests use
path-style addressing (``http://host:port/bucket/key``), which MinIO and moto expect.

Semantics
---------
- `put` is a single PUT request: S3 stores the whole object or nothing, and a reader sees
  the previous object or the new one, never a part (objects up to 5 GB; model artifacts
  are far smaller). boto3 sends a checksum with it, which the server verifies (an older
  S3-compatible server that rejects such checksums works with botocore's own setting
  ``AWS_REQUEST_CHECKSUM_CALCULATION=when_required``).
- Unlike :class:`~functions.objectstore.FileObjectStore`, S3 lets ``a`` and ``a/b`` both
  exist; keep keys that do not nest so they stay portable between stores.
- `list` skips objects below the prefix whose names are not valid keys (e.g. the empty
  "folder" objects ``x/`` the S3 console creates): no method here could read them.
- Failures other than a missing key raise :class:`S3Error` (an :class:`OSError`) naming
  the operation, the object's ``s3://`` location, the endpoint and S3's error code; a
  bucket that does not exist raises :class:`BucketNotFound`, checked when the store is
  opened so a misconfigured URL fails at start-up, not at the first model publish.
"""

from __future__ import annotations

import os
import re
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from functions.objectstore import (
    ObjectNotFound,
    ObjectStore,
    validate_delete_prefix,
    validate_key,
    validate_prefix,
)

__all__ = [
    "ENDPOINT_ENV",
    "BucketNotFound",
    "S3Error",
    "S3ObjectStore",
    "parse_s3_url",
]

ENDPOINT_ENV = "DRIFTLINE_S3_ENDPOINT_URL"

# S3's bucket name characters and minimum length, loose enough for legacy us-east-1 names.
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{2,254}$")

# S3 answers a missing object with NoSuchKey (GET) or a bare 404 (HEAD, no body).
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket", "404", "NotFound"})

_MAX_PAGE_SIZE = 1000  # S3's own cap on keys per ListObjectsV2 response
_DELETE_BATCH = 1000  # S3's cap on keys per DeleteObjects request


class S3Error(OSError):
    """An S3 request failed for a reason other than a missing key.

    Attributes: `code` (S3's error code, e.g. ``AccessDenied``, or None for a transport
    failure), `status` (the HTTP status, when there was a response).
    """

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.code = code
        self.status = status


class BucketNotFound(S3Error):
    """The store's bucket does not exist (on the endpoint the store talks to)."""

    def __init__(self, message: str, *, bucket: str = "", **kwargs: Any):
        super().__init__(message, **kwargs)
        self.bucket = bucket


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix")``; the prefix may be empty.

    The URL is taken literally, as the AWS CLI does (no percent-decoding). A query string
    or fragment is rejected rather than silently made part of the prefix: the endpoint is
    configured with ``DRIFTLINE_S3_ENDPOINT_URL``, not in the URL.

    >>> parse_s3_url("s3://models/prod/driftline/")
    ('models', 'prod/driftline')
    """
    if not isinstance(url, str):
        raise ValueError(f"S3 object store URL must be a string, got {url!r}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "s3":
        raise ValueError(f"S3 object store URL must look like s3://bucket/prefix, got {url!r}")
    if "?" in rest or "#" in rest:
        raise ValueError(
            f"S3 object store URL {url!r} may not have a query or fragment; "
            f"set {ENDPOINT_ENV} to choose the endpoint"
        )
    bucket, _, prefix = rest.partition("/")
    _check_bucket(bucket, url)
    prefix = prefix.removesuffix("/")
    _check_store_prefix(prefix, url)
    return bucket, prefix


def _check_bucket(bucket: str, where: str) -> None:
    if not isinstance(bucket, str) or not _BUCKET_RE.match(bucket):
        raise ValueError(f"invalid S3 bucket name {bucket!r} in {where!r}")


def _check_store_prefix(prefix: str, where: str) -> None:
    if not prefix:
        return
    try:
        validate_key(prefix)
    except ValueError as exc:
        raise ValueError(f"invalid S3 object store prefix {prefix!r} in {where!r}: {exc}") from exc
    if "?" in prefix or "#" in prefix:  # would not survive the s3:// URL round trip
        raise ValueError(f"S3 object store prefix {prefix!r} may not contain '?' or '#'")


class S3ObjectStore(ObjectStore):
    """Objects under ``s3://bucket/prefix``: key ``k`` is the S3 object ``prefix/k``.

    Parameters
    ----------
    bucket
        The bucket; it must exist (see `create_bucket`), else :class:`BucketNotFound`.
    prefix
        '/'-separated path the store's keys live under; "" for the whole bucket. A
        trailing '/' is ignored.
    endpoint_url
        S3-compatible server, e.g. ``http://127.0.0.1:9000`` for MinIO; default: the
        ``DRIFTLINE_S3_ENDPOINT_URL`` environment variable, else boto3's configuration.
    region_name
        Default: boto3's configuration; ``us-east-1`` with a custom endpoint and none set.
    client
        A ready boto3 S3 client to use instead of building one (`endpoint_url` and
        `region_name` must then be left out).
    create_bucket
        Create the bucket when it does not exist, instead of raising.
    page_size
        Keys per ListObjectsV2 request in :meth:`list` (1–1000).

    Examples
    --------
    >>> store = S3ObjectStore("my-bucket", "driftline/prod")  # doctest: +SKIP
    >>> store.put("models/v1/0123456789abcdef.npz", b"...")  # doctest: +SKIP
    >>> store.url  # doctest: +SKIP
    's3://my-bucket/driftline/prod'
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        client: Any = None,
        create_bucket: bool = False,
        page_size: int = _MAX_PAGE_SIZE,
    ) -> None:
        _check_bucket(bucket, "bucket argument")
        if not isinstance(prefix, str):
            raise ValueError(f"S3 object store prefix must be a string, got {prefix!r}")
        prefix = prefix.removesuffix("/")
        _check_store_prefix(prefix, "prefix argument")
        if isinstance(page_size, bool) or not isinstance(page_size, int):
            raise ValueError(f"page_size must be an int, got {page_size!r}")
        if not 1 <= page_size <= _MAX_PAGE_SIZE:
            raise ValueError(f"page_size must be in 1..{_MAX_PAGE_SIZE}, got {page_size}")
        self._bucket = bucket
        self._prefix = prefix
        self._page_size = page_size
        if client is None:
            client = _make_client(endpoint_url, region_name)
        elif endpoint_url is not None or region_name is not None:
            raise ValueError("pass either a client or endpoint_url/region_name, not both")
        self._client = client
        self._ensure_bucket(create_bucket)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> S3ObjectStore:
        """The store an ``s3://bucket/prefix`` URL names; `kwargs` go to the constructor."""
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, **kwargs)

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The store's prefix inside the bucket, without a trailing '/' ("" for none)."""
        return self._prefix

    @property
    def endpoint_url(self) -> str:
        """The server the client talks to (AWS's regional endpoint unless configured)."""
        return str(self._client.meta.endpoint_url)

    @property
    def client(self) -> Any:
        """The boto3 S3 client the store sends its requests with (thread-safe)."""
        return self._client

    @property
    def url(self) -> str:
        # The endpoint is not part of the URL: reopening it needs the same configuration.
        return f"s3://{self._bucket}/{self._prefix}" if self._prefix else f"s3://{self._bucket}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, endpoint_url={self.endpoint_url!r})"

    # -- the ObjectStore interface ---------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        name = self._name(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"object data must be bytes, got {type(data).__name__}")
        try:
            self._client.put_object(Bucket=self._bucket, Key=name, Body=bytes(data))
        except (ClientError, BotoCoreError) as exc:
            raise self._failure("PutObject", self._where(name), exc) from exc

    def get(self, key: str) -> bytes:
        name = self._name(key)
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=name)
            body = response["Body"]
            try:
                return body.read()  # botocore checks the length (and checksum) it read
            finally:
                body.close()
        except ClientError as exc:
            if _error_code(exc) in _MISSING_KEY_CODES:
                raise ObjectNotFound(key) from exc
            raise self._failure("GetObject", self._where(name), exc, reading=True) from exc
        except BotoCoreError as exc:
            raise self._failure("GetObject", self._where(name), exc, reading=True) from exc

    def exists(self, key: str) -> bool:
        name = self._name(key)
        try:
            self._client.head_object(Bucket=self._bucket, Key=name)
        except ClientError as exc:
            # A HEAD response has no body, so a 404 cannot tell a missing key from a
            # missing bucket; the bucket was checked when the store was opened.
            if _error_code(exc) in _MISSING_KEY_CODES:
                return False
            raise self._failure("HeadObject", self._where(name), exc, reading=True) from exc
        except BotoCoreError as exc:
            raise self._failure("HeadObject", self._where(name), exc, reading=True) from exc
        return True

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            self._client.delete_object(Bucket=self._bucket, Key=name)  # missing: S3 says 204
        except ClientError as exc:
            if _error_code(exc) == "NoSuchKey":
                return
            raise self._failure("DeleteObject", self._where(name), exc) from exc
        except BotoCoreError as exc:
            raise self._failure("DeleteObject", self._where(name), exc) from exc

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        base = f"{self._prefix}/" if self._prefix else ""
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket,
                Prefix=base + prefix,
                PaginationConfig={"PageSize": self._page_size},
            )
            for page in pages:
                for entry in page.get("Contents", ()):
                    key = entry["Key"][len(base) :]
                    if _is_valid_key(key):
                        keys.append(key)
        except (ClientError, BotoCoreError) as exc:
            raise self._failure("ListObjectsV2", self._where(base + prefix) + "*", exc) from exc
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        """As :meth:`ObjectStore.delete_prefix`, with one DeleteObjects request per
        thousand keys (S3's limit) instead of one request per key."""
        keys = self.list(validate_delete_prefix(prefix))
        for start in range(0, len(keys), _DELETE_BATCH):
            names = [self._name(key) for key in keys[start : start + _DELETE_BATCH]]
            try:
                response = self._client.delete_objects(
                    Bucket=self._bucket,
                    Delete={"Objects": [{"Key": name} for name in names], "Quiet": True},
                )
            except (ClientError, BotoCoreError) as exc:
                raise self._failure("DeleteObjects", self._where(names[0]), exc) from exc
            errors = [e for e in response.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise S3Error(
                    f"S3 DeleteObjects via {self.endpoint_url} could not delete "
                    f"{len(errors)} of {len(names)} objects, first "
                    f"{self._where(first.get('Key', '?'))}: {first.get('Code')} "
                    f"{first.get('Message', '')}".rstrip(),
                    code=first.get("Code"),
                )
        return len(keys)

    # -- internals -------------------------------------------------------------------

    def _name(self, key: str) -> str:
        validate_key(key)
        return f"{self._prefix}/{key}" if self._prefix else key

    def _where(self, name: str) -> str:
        return f"s3://{self._bucket}/{name}"

    def _ensure_bucket(self, create: bool) -> None:
        try:
            self._client.head_bucket(Bucket=self._bucket)
            return
        except ClientError as exc:
            code = _error_code(exc)
            if code in ("403", "AccessDenied"):
                # Credentials scoped to objects under a prefix may not inspect the bucket
                # itself; the first object request will tell if anything is wrong.
                return
            if code not in _MISSING_BUCKET_CODES:
                raise self._failure("HeadBucket", self._where(""), exc) from exc
            if not create:
                raise self._missing_bucket(exc) from exc
        except BotoCoreError as exc:
            raise self._failure("HeadBucket", self._where(""), exc) from exc
        self._create_bucket()

    def _create_bucket(self) -> None:
        request: dict[str, Any] = {"Bucket": self._bucket}
        region = self._client.meta.region_name
        if region and region not in ("us-east-1", "aws-global"):
            request["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**request)
        except ClientError as exc:
            # BucketAlreadyOwnedByYou: another opener of the store created it meanwhile.
            if _error_code(exc) != "BucketAlreadyOwnedByYou":
                raise self._failure("CreateBucket", self._where(""), exc) from exc
        except BotoCoreError as exc:
            raise self._failure("CreateBucket", self._where(""), exc) from exc

    def _missing_bucket(self, exc: Exception | None = None) -> BucketNotFound:
        return BucketNotFound(
            f"S3 bucket {self._bucket!r} does not exist at {self.endpoint_url} "
            f"(object store {self.url}); create it, or open the store with create_bucket=True",
            bucket=self._bucket,
            code=_error_code(exc) if isinstance(exc, ClientError) else None,
            status=_status(exc) if isinstance(exc, ClientError) else None,
        )

    def _failure(
        self, operation: str, where: str, exc: Exception, *, reading: bool = False
    ) -> S3Error:
        """A clear exception for a failed request on `where` (an s3:// location)."""
        if not isinstance(exc, ClientError):
            return S3Error(f"S3 {operation} on {where} via {self.endpoint_url} failed: {exc}")
        code, status = _error_code(exc), _status(exc)
        if code == "NoSuchBucket":
            return self._missing_bucket(exc)
        detail = exc.response.get("Error", {}).get("Message") or ""
        message = f"S3 {operation} on {where} via {self.endpoint_url} failed: {code}"
        if status is not None:
            message += f" (HTTP {status})"
        if detail:
            message += f": {detail}"
        if status == 403 and reading:  # GetObject / HeadObject
            message += (
                "; S3 also answers 403 instead of 404 for a missing object when the "
                "credentials may not list the bucket (s3:ListBucket)"
            )
        return S3Error(message, code=code, status=status)


def _make_client(endpoint_url: str | None, region_name: str | None) -> Any:
    if endpoint_url is None:
        endpoint_url = os.environ.get(ENDPOINT_ENV) or None
    # A session of its own: boto3's default session is not thread-safe to create clients on.
    session = boto3.session.Session()
    if endpoint_url is not None and region_name is None and session.region_name is None:
        region_name = "us-east-1"  # MinIO and moto sign with some region; this is theirs
    config = Config(
        retries={"mode": "standard", "max_attempts": 5},
        s3={"addressing_style": "path"} if endpoint_url is not None else None,
    )
    return session.client("s3", endpoint_url=endpoint_url, region_name=region_name, config=config)


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _is_valid_key(key: str) -> bool:
    try:
        validate_key(key)
    except ValueError:
        return False
    return True
