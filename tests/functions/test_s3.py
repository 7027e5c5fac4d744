"""The S3 object store against moto's S3 server (a real HTTP endpoint on loopback).

The store conformance test in ``test_objectstore.py`` runs on S3 too (with the helpers
here); this module covers what only S3 has: prefixes inside a bucket, pagination,
missing buckets, S3's error answers and URL parsing.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber

import functions
from functions.objectstore import ObjectNotFound, open_object_store
from functions.s3 import ENDPOINT_ENV, BucketNotFound, S3Error, S3ObjectStore, parse_s3_url

ALLOWED_IMPORTS = {"boto3", "botocore", "numpy", "functions", "__future__"}


@contextlib.contextmanager
def moto_s3_server() -> Iterator[str]:
    """Start moto's S3 server on a free loopback port; yields its endpoint URL."""
    server_module = pytest.importorskip("moto.server", reason="needs moto[server] (test extra)")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def fake_aws(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """Dummy credentials and region, our endpoint, and nothing from the machine's AWS setup."""
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(ENDPOINT_ENV, endpoint)


def fresh_bucket_name() -> str:
    return f"driftline-test-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def endpoint(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    fake_aws(monkeypatch, s3_endpoint)
    return s3_endpoint


@pytest.fixture
def bucket(endpoint: str) -> str:
    name = fresh_bucket_name()
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return name


def count_requests(store: S3ObjectStore, operation: str) -> list[str]:
    """A list that grows by one entry per `operation` request the store's client sends."""
    calls: list[str] = []
    store.client.meta.events.register(
        f"before-call.s3.{operation}", lambda **kwargs: calls.append(operation)
    )
    return calls


def test_open_object_store_returns_an_s3_store(endpoint: str, bucket: str) -> None:
    store = open_object_store(f"s3://{bucket}/some/prefix/")
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix) == (bucket, "some/prefix")
    assert store.url == f"s3://{bucket}/some/prefix" and store.endpoint_url == endpoint
    assert repr(store) == f"S3ObjectStore('s3://{bucket}/some/prefix', endpoint_url={endpoint!r})"

    store.put("models/v1/model.npz", b"weights")
    raw = boto3.client("s3", endpoint_url=endpoint)
    body = raw.get_object(Bucket=bucket, Key="some/prefix/models/v1/model.npz")["Body"].read()
    assert body == b"weights"  # key k lives at <prefix>/k

    whole = open_object_store(f"s3://{bucket}")
    assert whole.url == f"s3://{bucket}" and whole.list() == ["some/prefix/models/v1/model.npz"]
    assert open_object_store(store.url).get("models/v1/model.npz") == b"weights"


def test_endpoint_argument_wins_over_the_environment(
    endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENDPOINT_ENV, "http://127.0.0.1:9")  # nothing listens there
    store = S3ObjectStore(bucket, "p", endpoint_url=endpoint)
    assert store.endpoint_url == endpoint and store.list() == []


def test_list_paginates_and_is_relative_to_the_prefix(endpoint: str, bucket: str) -> None:
    store = S3ObjectStore(bucket, "jobs/j1", page_size=7)
    keys = [f"deltas/e{epoch}/w{worker:02d}.npz" for epoch in range(3) for worker in range(10)]
    for key in reversed(keys):
        store.put(key, b"d")
    S3ObjectStore(bucket, "jobs/j10").put("deltas/e0/w00.npz", b"other job")

    requests = count_requests(store, "ListObjectsV2")
    assert store.list() == sorted(keys)
    assert len(requests) == 5  # 30 keys at 7 per page
    assert store.list("deltas/e1/") == sorted(k for k in keys if k.startswith("deltas/e1/"))
    assert store.list("deltas/e1/w0") == [f"deltas/e1/w{w:02d}.npz" for w in range(10)]


def test_delete_prefix_batches_and_stays_inside_the_store_prefix(
    endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("functions.s3._DELETE_BATCH", 4)
    store = S3ObjectStore(bucket, "jobs/j1")
    keys = [f"deltas/e0/w{worker:02d}.pack" for worker in range(10)]
    for key in keys:
        store.put(key, b"d")
    other = S3ObjectStore(bucket, "jobs/j10")
    other.put("deltas/e0/w00.pack", b"other job")

    requests = count_requests(store, "DeleteObjects")
    assert store.delete_prefix("deltas/") == 10
    assert len(requests) == 3  # 10 keys at 4 per request
    assert store.list() == [] and other.list() == ["deltas/e0/w00.pack"]


def test_prefixes_isolate_stores_on_one_bucket(endpoint: str, bucket: str) -> None:
    a, ab, root = (S3ObjectStore(bucket, p) for p in ("a", "ab", ""))
    a.put("models/v1/m.npz", b"from a")
    ab.put("models/v1/m.npz", b"from ab")
    ab.put("only-ab", b"")
    assert a.list() == ["models/v1/m.npz"] and a.list("only") == []
    assert ab.list() == ["models/v1/m.npz", "only-ab"]
    assert a.get("models/v1/m.npz") == b"from a" and ab.get("models/v1/m.npz") == b"from ab"
    assert not a.exists("only-ab")
    with pytest.raises(ObjectNotFound):
        a.get("only-ab")
    a.delete("only-ab")  # not a's object: nothing happens to ab's
    assert ab.exists("only-ab")
    assert root.list() == ["a/models/v1/m.npz", "ab/models/v1/m.npz", "ab/only-ab"]


def test_missing_bucket_is_named(endpoint: str) -> None:
    name = fresh_bucket_name()
    with pytest.raises(BucketNotFound, match=f"bucket '{name}' does not exist") as caught:
        open_object_store(f"s3://{name}/prefix")
    assert caught.value.bucket == name and isinstance(caught.value, OSError)

    store = S3ObjectStore(name, "prefix", create_bucket=True)
    store.put("k", b"v")
    again = S3ObjectStore(name, "prefix", create_bucket=True)  # exists already: fine
    assert again.get("k") == b"v"


def test_bucket_deleted_under_an_open_store(endpoint: str) -> None:
    name = fresh_bucket_name()
    store = S3ObjectStore(name, create_bucket=True)
    store.client.delete_bucket(Bucket=name)
    with pytest.raises(BucketNotFound, match=name):
        store.get("k")
    with pytest.raises(BucketNotFound, match=name):
        store.list()


def test_list_skips_names_that_are_not_keys(endpoint: str, bucket: str) -> None:
    store = S3ObjectStore(bucket, "p")
    store.put("real/key", b"1")
    for name in ("p/folder/", "p/a//b", "p", "p/../escape"):  # e.g. S3 console folders
        store.client.put_object(Bucket=bucket, Key=name, Body=b"")
    assert store.list() == ["real/key"]


def test_unsafe_keys_are_rejected_before_any_request(endpoint: str, bucket: str) -> None:
    store = S3ObjectStore(bucket, "p")
    with Stubber(store.client):  # any request would fail: the stubber has no answers queued
        for key in ("", "/abs", "../up", "a//b", "a/", "a\\b", "a/./b", "a\x00"):
            with pytest.raises(ValueError, match="key"):
                store.put(key, b"x")
            with pytest.raises(ValueError, match="key"):
                store.get(key)
            with pytest.raises(ValueError, match="key"):
                store.exists(key)
            with pytest.raises(ValueError, match="key"):
                store.delete(key)
        for prefix in ("../", "/abs", "a\\b"):
            with pytest.raises(ValueError, match="prefix"):
                store.list(prefix)
        with pytest.raises(TypeError, match="bytes"):
            store.put("k", "text")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("head_object", lambda s: s.exists("k")),
        ("get_object", lambda s: s.get("k")),
        ("put_object", lambda s: s.put("k", b"x")),
        ("delete_object", lambda s: s.delete("k")),
    ],
)
def test_errors_other_than_missing_say_what_failed(
    endpoint: str, bucket: str, operation: str, call: object
) -> None:
    store = S3ObjectStore(bucket, "p")
    with Stubber(store.client) as stub:
        stub.add_client_error(operation, "AccessDenied", "Access Denied", 403)
        with pytest.raises(S3Error, match=f"s3://{bucket}/p/k.*AccessDenied.*403") as caught:
            call(store)  # type: ignore[operator]
    assert caught.value.code == "AccessDenied" and caught.value.status == 403
    # A read may be denied because the object is missing: S3 hides 404s from callers
    # that may not list the bucket; the message says so.
    assert ("s3:ListBucket" in str(caught.value)) == (operation in ("head_object", "get_object"))
    assert not isinstance(caught.value, ObjectNotFound)

    with Stubber(store.client) as stub:
        stub.add_client_error("list_objects_v2", "InternalError", "We broke", 500)
        with pytest.raises(S3Error, match=f"ListObjectsV2 on s3://{bucket}/p/x\\*.*We broke"):
            store.list("x")


def test_unreachable_endpoint_names_it(endpoint: str) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=dead, config=Config(retries={"total_max_attempts": 1}))
    with pytest.raises(S3Error, match=f"HeadBucket on s3://bucket-x/ via {dead} failed"):
        S3ObjectStore("bucket-x", client=client)


def test_errors_survive_pickling() -> None:
    error = pickle.loads(pickle.dumps(BucketNotFound("gone", bucket="b", code="NoSuchBucket")))
    assert (str(error), error.bucket, error.code) == ("gone", "b", "NoSuchBucket")
    plain = pickle.loads(pickle.dumps(S3Error("denied", code="AccessDenied", status=403)))
    assert (str(plain), plain.code, plain.status) == ("denied", "AccessDenied", 403)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
        ("S3://bucket/a/b/", ("bucket", "a/b")),
        ("s3://my.bucket-1/models", ("my.bucket-1", "models")),
    ],
)
def test_parse_s3_url(url: str, expected: tuple[str, str]) -> None:
    assert parse_s3_url(url) == expected


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("s3://", "bucket"),
        ("s3:///prefix", "bucket"),
        ("s3://b/p", "bucket"),  # too short for a bucket name
        ("s3://bucket//p", "prefix"),
        ("s3://bucket/a/../b", "prefix"),
        ("s3://bucket/p?endpoint=http://x", ENDPOINT_ENV),
        ("file:///tmp", "s3://bucket/prefix"),
    ],
)
def test_bad_s3_urls_are_rejected_without_a_request(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_s3_url(url)
    if url.lower().startswith("s3://"):
        with pytest.raises(ValueError, match=match):
            open_object_store(url)


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="page_size"):
        S3ObjectStore("bucket", page_size=0)
    with pytest.raises(ValueError, match="page_size"):
        S3ObjectStore("bucket", page_size=1001)
    with pytest.raises(ValueError, match="either a client"):
        S3ObjectStore("bucket", client=object(), endpoint_url="http://x")


def test_s3_module_imports_only_what_a_lambda_package_has() -> None:
    path = Path(functions.__file__).parent / "s3.py"
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= ALLOWED_IMPORTS | set(sys.stdlib_module_names), roots


def test_file_stores_do_not_load_boto3(tmp_path: Path) -> None:
    code = (
        "import sys, functions\n"
        "from functions.objectstore import open_object_store\n"
        f"open_object_store({str(tmp_path)!r}).put('k', b'v')\n"
        "print(sorted(m for m in ('boto3', 'botocore') if m in sys.modules))\n"
    )
    root = Path(functions.__file__).parent.parent
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
