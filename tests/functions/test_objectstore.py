"""Object stores: the conformance every store passes, and the file store's specifics.

The conformance test runs on the file store (opened three ways) and on S3 (moto's server;
the S3 specifics are in ``test_s3.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from functions.objectstore import (
    FileObjectStore,
    ObjectNotFound,
    ObjectStore,
    model_key,
    open_object_store,
    register_object_store,
    validate_key,
)
from functions.s3 import S3ObjectStore
from tests.functions.test_s3 import fake_aws, fresh_bucket_name, moto_s3_server


def s3_store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """A store under a prefix of a fresh bucket on the module's moto S3 server."""
    endpoint = request.getfixturevalue("s3_endpoint")
    fake_aws(request.getfixturevalue("monkeypatch"), endpoint)  # endpoint from the environment
    bucket = fresh_bucket_name()
    S3ObjectStore(bucket, create_bucket=True)
    return open_object_store(f"s3://{bucket}/conformance/run")


STORES: dict[str, Callable[[pytest.FixtureRequest, Path], ObjectStore]] = {
    "file-class": lambda request, tmp: FileObjectStore(tmp / "store"),
    "plain-path": lambda request, tmp: open_object_store(str(tmp / "store")),
    "file-url": lambda request, tmp: open_object_store((tmp / "store").as_uri()),
    "s3": s3_store,
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server, started once for this module (only if an s3 test runs)."""
    with moto_s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=list(STORES), ids=list(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    return STORES[request.param](request, tmp_path)


def test_store_conformance(store: ObjectStore) -> None:
    key = model_key("v1", "0" * 64)
    assert not store.exists(key) and store.list() == []
    with pytest.raises(ObjectNotFound, match="models/v1/0000000000000000.npz"):
        store.get(key)

    store.put(key, b"first")
    store.put(key, b"second")  # replaces
    store.put("models/v10/model.npz", b"ten")
    store.put("models/v2/model.npz", bytearray(b"two"))
    store.put("other", b"")
    assert store.get(key) == b"second" and store.get("other") == b""
    assert store.exists(key)

    assert store.list() == sorted([key, "models/v10/model.npz", "models/v2/model.npz", "other"])
    assert store.list("models/v1") == [key, "models/v10/model.npz"]
    assert store.list("models/v1/") == [key]
    assert store.list("nothing/") == [] and store.list("oth") == ["other"]

    store.delete(key)
    store.delete(key)  # missing is fine
    assert not store.exists(key) and key not in store.list()
    assert open_object_store(store.url).get("other") == b""


def test_delete_prefix_deletes_only_what_starts_with_it(store: ObjectStore) -> None:
    job = [f"deltas/job-1/e{e}/w{w}.pack" for e in range(3) for w in range(4)]
    kept = ["deltas/job-10/e0/w0.pack", "deltas/job-2/e0/w0.pack", "models/v1/m.npz"]
    for key in job + kept:
        store.put(key, b"x")

    assert store.delete_prefix("deltas/job-1/") == len(job)
    assert store.list() == sorted(kept)
    assert store.delete_prefix("deltas/job-1/") == 0  # nothing left: not an error
    assert store.delete_prefix("deltas/job-") == 2
    assert store.list() == ["models/v1/m.npz"]
    for prefix in ("", "../", "/abs"):
        with pytest.raises(ValueError):
            store.delete_prefix(prefix)
    assert store.list() == ["models/v1/m.npz"]


def test_file_delete_prefix_leaves_no_empty_directories(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    store.put("shards/job-1/4/w0.npz", b"x")
    store.put("shards/job-1/2/w1.npz", b"x")
    store.put("shards/job-2/4/w0.npz", b"x")

    assert store.delete_prefix("shards/job-1/") == 2
    assert not (tmp_path / "shards" / "job-1").exists()
    assert (tmp_path / "shards" / "job-2" / "4" / "w0.npz").is_file()


@pytest.mark.parametrize(
    "key",
    ["", "/etc/passwd", "../outside", "a/../../b", "a\\b", "a//b", "a/", "./a", "a/./b", "a\x00"],
)
def test_unsafe_keys_are_rejected(tmp_path: Path, key: str) -> None:
    store = FileObjectStore(tmp_path)
    with pytest.raises(ValueError, match="key"):
        store.put(key, b"x")
    with pytest.raises(ValueError, match="key"):
        store.get(key)
    with pytest.raises(ValueError):
        validate_key(key)
    assert list(tmp_path.iterdir()) == []


def test_list_rejects_escaping_prefix(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    for prefix in ("../", "/abs", "a\\b"):
        with pytest.raises(ValueError, match="prefix"):
            store.list(prefix)


def test_put_leaves_no_temp_file_and_is_durable_on_disk(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    store.put("a/b/c.bin", b"payload")
    assert (tmp_path / "a" / "b" / "c.bin").read_bytes() == b"payload"
    assert os.listdir(tmp_path / "a" / "b") == ["c.bin"]


def test_failed_put_keeps_old_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileObjectStore(tmp_path)
    store.put("k", b"old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        store.put("k", b"new")
    monkeypatch.undo()
    assert store.get("k") == b"old"
    assert os.listdir(tmp_path) == ["k"]  # the temp file was removed


def test_readers_never_see_partial_objects(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    versions = [bytes([n]) * 200_000 for n in range(1, 6)]
    store.put("model", versions[0])
    done = threading.Event()

    def writer() -> None:
        for _ in range(10):
            for data in versions:
                store.put("model", data)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = 0
    while not done.is_set() or seen == 0:
        assert store.get("model") in versions
        seen += 1
    thread.join()
    assert store.list() == ["model"]


def test_temp_files_are_not_listed(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    store.put("a/x", b"1")
    (tmp_path / "a" / ".tmp-put-abandoned").write_bytes(b"half")
    assert store.list() == ["a/x"]


def test_nested_key_conflicts_are_value_errors(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    store.put("a", b"1")
    with pytest.raises(ValueError, match="a/b"):
        store.put("a/b", b"2")
    store.put("d/e", b"3")
    with pytest.raises(ValueError, match="prefix"):
        store.put("d", b"4")
    assert not store.exists("d")
    store.delete("d")  # a "directory" is not an object
    with pytest.raises(ObjectNotFound):
        store.get("d")
    with pytest.raises(ObjectNotFound):
        store.get("a/b")


def test_object_not_found_is_a_key_error() -> None:
    error = ObjectNotFound("models/x")
    assert isinstance(error, KeyError) and error.key == "models/x"
    assert str(error) == "no object with key 'models/x'"


def test_url_round_trips(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "with space")
    assert store.url.startswith("file:///")
    reopened = open_object_store(store.url)
    assert isinstance(reopened, FileObjectStore) and reopened.root == store.root


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("gs://bucket/prefix", "'gs'.*supported: file://, s3://"),
        ("s3://", "bucket"),
        ("file://remote-host/path", "absolute"),
        ("", "non-empty"),
    ],
)
def test_open_object_store_rejects_unsupported_urls(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        open_object_store(url)


def test_registered_schemes_are_dispatched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from functions import objectstore

    monkeypatch.setattr(objectstore, "_FACTORIES", dict(objectstore._FACTORIES))
    opened: list[str] = []

    def factory(url: str) -> ObjectStore:
        opened.append(url)
        return FileObjectStore(tmp_path)

    register_object_store("mem", factory)
    assert isinstance(open_object_store("MEM://anything"), FileObjectStore)
    assert opened == ["MEM://anything"]
    with pytest.raises(ValueError, match="scheme"):
        register_object_store("bad scheme", factory)


def test_model_key_layout() -> None:
    digest = "ab" * 32
    assert model_key("20240101-abc", digest) == "models/20240101-abc/abababababababab.npz"
    for bad in ("", "a/b", ".."):
        with pytest.raises(ValueError):
            model_key(bad, digest)
    with pytest.raises(ValueError, match="sha256"):
        model_key("v1", "not-hex-at-all!!")
