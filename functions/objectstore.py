"""The object store: named immutable blobs shared by the registry, coordinator and workers.

The serving process, the retraining coordinator and its short-lived workers share no
memory and no database connection; they exchange model versions (and, with distributed
training, data shards and updates) through an object store. :class:`ObjectStore` is the
small interface all of them program against; :class:`FileObjectStore` implements it on a
local directory (the embedded default and the test double), and
:class:`functions.s3.S3ObjectStore` on an S3 bucket (``s3://bucket/prefix``; boto3 is
imported only when such a store is opened). Further schemes join through
:func:`register_object_store` without changes to the callers.

Keys are '/'-separated relative paths, as in S3 (``models/v3/model.npz``). Writes are
atomic: a reader sees the previous object or the complete new one, never a part.
Every store applies the same key rule (:func:`validate_key`), so keys are portable; on
S3 a store's keys live under its prefix (key ``k`` of ``s3://bucket/p`` is object ``p/k``).

Key layout
----------
``models/<version>/<sha256[:16]>.npz``
    A published model version: the artifact of :func:`functions.artifacts.model_to_bytes`.
    Its full checksum lives in the model registry, which verifies it on load; having
    part of it in the key means two publishers racing for one version name write
    different objects instead of overwriting each other.

Distributed retraining (``docs/architecture.md``, "Retraining") adds, per job
(:mod:`functions.shards` builds the keys and reads and writes the objects; a worker is
told its keys in its event, so these are conventions of the coordinator, not rules of
the store):

``snapshots/<job>/<epoch:06d>.pack``
    The model φ_t the epoch's workers pull: its arrays (``BiasedMF.to_arrays``) packed by
    :func:`functions.artifacts.pack_arrays`, read back by ``model_from_bytes``.
``shards/<job>/<worker:05d>-of-<workers:05d>.npz``
    Worker `worker`'s part of the job's data window split `workers` ways (the number of
    workers may change between epochs): ``users``, ``items`` (int64 rows of the snapshot
    model) and ``ratings`` (float64); :func:`functions.shards.write_shard`.
``deltas/<job>/<epoch:06d>/<worker:05d>.pack``
    A worker's update in an epoch, ``trained - snapshot`` on the rows its shard touched,
    written by :func:`functions.handler.handler` (layout in :mod:`functions.shards`).

``checkpoints/<job>/latest.json``
    The coordinator's state after its last finished epoch, replaced every epoch, so a
    crashed coordinator resumes (:meth:`retrain.coordinator.DistributedBackend.resume`):
    epoch number, the snapshot of the model and its SHA-256, the shard split, the seed,
    the invocations in flight, the epoch records and stats. Written last, after the
    objects it names. Layout in :mod:`retrain.coordinator`.
``checkpoints/<job>/window.npz``
    The job's encoded training data (``users``, ``items``, ``ratings`` and the shard
    ``order``), written once with the first checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = [
    "MODELS_PREFIX",
    "FileObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "model_key",
    "open_object_store",
    "register_object_store",
    "validate_key",
    "validate_prefix",
]

MODELS_PREFIX = "models/"

# Temporary files of in-flight writes start with this; keys may not, so a temp file
# can never be mistaken for (or collide with) an object.
_TMP_PREFIX = ".tmp-put-"


class ObjectNotFound(KeyError):
    """No object is stored under the key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        # KeyError's own __str__ shows only the repr of its argument.
        return f"no object with key {self.key!r}"


class ObjectStore(ABC):
    """Named blobs behind '/'-separated keys; see the module docstring for the layout."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing any object there, atomically."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; :class:`ObjectNotFound` if there is none."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object under `key`; a missing object is not an error."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with `prefix` (a plain string prefix, as in S3)."""

    def delete_prefix(self, prefix: str) -> int:
        """Remove every object whose key starts with `prefix`; returns how many.

        Jobs keep their working objects (shards, snapshots, deltas) under a per-job
        prefix, so one call frees all of them. The prefix must be non-empty: an empty
        one would match the whole store, models included, which no caller means. Stores
        override this where the backend deletes in batches.
        """
        keys = self.list(validate_delete_prefix(prefix))
        for key in keys:
            self.delete(key)
        return len(keys)

    @property
    @abstractmethod
    def url(self) -> str:
        """A URL that :func:`open_object_store` turns back into an equivalent store."""


def validate_key(key: str) -> str:
    """Return `key` if it is a safe relative '/'-separated key, else raise ValueError.

    Rejected: empty keys, absolute keys, backslashes, NUL, empty / '.' / '..'
    components and components starting with the temp-file prefix. On a file system this
    is what keeps every object inside the store's root; other stores apply the same
    rule so that keys are portable between them.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"object key {key!r} must be relative, without backslashes or NUL")
    for part in key.split("/"):
        if part in ("", ".", "..") or part.startswith(_TMP_PREFIX):
            raise ValueError(f"object key {key!r} has an invalid component {part!r}")
    return key


def model_key(version: str, sha256: str) -> str:
    """Key of a model version's artifact, ``models/<version>/<sha256[:16]>.npz``."""
    if not version or "/" in version:
        raise ValueError(f"model version must be non-empty and without '/', got {version!r}")
    digest = sha256.lower()
    if len(digest) < 16 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"sha256 must be a hex digest, got {sha256!r}")
    return validate_key(f"{MODELS_PREFIX}{version}/{digest[:16]}.npz")


class FileObjectStore(ObjectStore):
    """An object store in a local directory; each key is a file below `root`.

    `put` writes a temporary file in the target directory, fsyncs it, renames it over
    the target with ``os.replace`` (atomic on POSIX and Windows) and fsyncs the
    directory, so that after `put` returns the object survives a crash, and a
    concurrent reader sees the old or the new object, never a part. Unlike S3 objects,
    keys do not nest here: ``a`` and ``a/b`` cannot both exist (a ValueError says so).
    New files are readable by the owner only (``tempfile.mkstemp``'s 0600).

    Parameters
    ----------
    root
        Directory holding the objects; created if missing.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).expanduser().resolve()
        self._root.mkdir(parents=True, exist_ok=True)

    @property
    def root(self) -> Path:
        return self._root

    @property
    def url(self) -> str:
        return self._root.as_uri()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._root)!r})"

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*validate_key(key).split("/"))

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"object data must be bytes, got {type(data).__name__}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as exc:
            raise ValueError(f"key {key!r} runs through an existing object") from exc
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except IsADirectoryError as exc:
            _discard(tmp)
            raise ValueError(f"key {key!r} is a prefix of existing objects") from exc
        except BaseException:  # incl. KeyboardInterrupt: never leave the temp file behind
            _discard(tmp)
            raise
        _fsync_directory(path.parent)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(key) from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        if not path.is_file():
            return
        with contextlib.suppress(FileNotFoundError):  # a concurrent delete won the race
            path.unlink()

    def delete_prefix(self, prefix: str) -> int:
        """As :meth:`ObjectStore.delete_prefix`, and directories left empty under the
        prefix are removed too, so a store that deletes finished jobs stays flat."""
        deleted = super().delete_prefix(prefix)
        directory = prefix.rpartition("/")[0]
        base = self._root.joinpath(*directory.split("/")) if directory else self._root
        for current, _, _ in os.walk(base, topdown=False):  # children before parents
            path = Path(current)
            rel = path.relative_to(self._root).as_posix()
            if path != self._root and f"{rel}/".startswith(prefix):
                with contextlib.suppress(OSError):  # not empty: another writer's object
                    path.rmdir()
        return deleted

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        directory, _, _ = prefix.rpartition("/")
        base = self._root.joinpath(*directory.split("/")) if directory else self._root
        keys: list[str] = []
        for current, dirnames, filenames in os.walk(base):
            rel = Path(current).relative_to(self._root).as_posix()
            rel = "" if rel == "." else f"{rel}/"
            # Descend only into directories that can hold keys with this prefix.
            dirnames[:] = [d for d in dirnames if _could_match(f"{rel}{d}/", prefix)]
            keys.extend(
                f"{rel}{name}"
                for name in filenames
                if not name.startswith(_TMP_PREFIX) and f"{rel}{name}".startswith(prefix)
            )
        return sorted(keys)


def validate_prefix(prefix: str) -> str:
    """Return `prefix` if :meth:`ObjectStore.list` may take it, else raise ValueError.

    A list prefix is a plain string prefix ("" lists everything, "models/v1" matches
    "models/v10/..." too), but like a key it must be relative, without backslashes, NUL
    or '..' components.
    """
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, got {prefix!r}")
    if prefix.startswith("/") or "\\" in prefix or "\x00" in prefix or ".." in prefix.split("/"):
        raise ValueError(f"prefix {prefix!r} must be relative, without backslashes or '..'")
    return prefix


def validate_delete_prefix(prefix: str) -> str:
    """`prefix`, validated, if :meth:`ObjectStore.delete_prefix` may take it."""
    if validate_prefix(prefix) == "":
        raise ValueError("delete_prefix needs a non-empty prefix; '' would empty the store")
    return prefix


def _could_match(directory: str, prefix: str) -> bool:
    return directory.startswith(prefix) or prefix.startswith(directory)


def _discard(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_directory(path: Path) -> None:
    """Make a rename in `path` durable; a no-op where directories cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. Windows, where a directory cannot be opened this way
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


ObjectStoreFactory = Callable[[str], ObjectStore]


def _open_file_url(url: str) -> ObjectStore:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise ValueError(f"file:// object store URL must be file:///absolute/path, got {url!r}")
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ValueError(f"file:// object store URL needs an absolute path, got {url!r}")
    return FileObjectStore(path)


def _open_s3_url(url: str) -> ObjectStore:
    # Imported here so that file:// stores (and a package without boto3) never load boto3.
    from functions.s3 import S3ObjectStore

    return S3ObjectStore.from_url(url)


_FACTORIES: dict[str, ObjectStoreFactory] = {"file": _open_file_url, "s3": _open_s3_url}


def register_object_store(scheme: str, factory: ObjectStoreFactory) -> None:
    """Make :func:`open_object_store` hand URLs with `scheme` (e.g. "s3") to `factory`.

    The factory receives the full URL. Registering a scheme again replaces its factory.
    """
    if not scheme or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        raise ValueError(f"invalid URL scheme {scheme!r}")
    _FACTORIES[scheme.lower()] = factory


def open_object_store(url: str) -> ObjectStore:
    """The object store a URL names: ``file:///abs/path``, a plain directory path, or
    ``s3://bucket/prefix`` (:class:`functions.s3.S3ObjectStore`; its endpoint comes from
    ``DRIFTLINE_S3_ENDPOINT_URL`` or boto3's configuration, see :mod:`functions.s3`).

    Other schemes are served by factories added with :func:`register_object_store`.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     store = open_object_store(root)
    ...     store.put("models/v1/model.npz", b"...")
    ...     print(store.list("models/"), open_object_store(store.url).get("models/v1/model.npz"))
    ['models/v1/model.npz'] b'...'
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"object store URL must be a non-empty string, got {url!r}")
    if "://" not in url:
        return FileObjectStore(url)
    scheme = url.split("://", 1)[0].lower()
    factory = _FACTORIES.get(scheme)
    if factory is None:
        supported = ", ".join(f"{s}://" for s in sorted(_FACTORIES))
        raise ValueError(
            f"unsupported object store scheme {scheme!r} in {url!r}; "
            f"supported: {supported} or a plain directory path"
        )
    return factory(url)
