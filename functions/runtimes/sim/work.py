"""How much work a worker event carries, read from the shard and snapshot it names."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from functions.artifacts import load_arrays
from functions.objectstore import ObjectStore, open_object_store
from functions.performance import Work

# -- the work of a payload ---------------------------------------------------------------


class UncostablePayload(ValueError):
    """Neither a label nor the payload says how much work an invocation is."""


class StoreWork:
    """``samples_of`` for worker events: reads the shard (and snapshot) from the store.

    The shard's sample count times ``local_epochs``, its minibatches at the event's
    ``batch_size``, bytes read (snapshot plus shard) and an estimate of the delta's
    bytes (8 bytes per value: row, bias, count and factors of each user and item the
    shard touches). Each shard and snapshot is read once; a store per URL is opened
    once, or ``store`` serves every URL.
    """

    def __init__(self, store: ObjectStore | None = None) -> None:
        self.store = store
        self._stores: dict[str, ObjectStore] = {}
        self._shards: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._snapshots: dict[tuple[str, str], tuple[int, int]] = {}
        self._lock = threading.Lock()

    def _open(self, url: str) -> ObjectStore:
        if self.store is not None:
            return self.store
        with self._lock:
            if url not in self._stores:
                self._stores[url] = open_object_store(url)
            return self._stores[url]

    def shard(self, url: str, key: str) -> tuple[int, int, int]:
        """(samples, bytes, distinct users + items) of a shard."""
        if (url, key) not in self._shards:
            data = self._open(url).get(key)
            arrays = load_arrays(data)
            if "ratings" not in arrays:
                raise ValueError(f"shard {key!r} holds no ratings array")
            touched = len(np.unique(arrays["users"])) + len(np.unique(arrays["items"]))
            self._shards[(url, key)] = (len(arrays["ratings"]), len(data), touched)
        return self._shards[(url, key)]

    def snapshot(self, url: str, key: str) -> tuple[int, int]:
        """(bytes, factors) of a model snapshot."""
        if (url, key) not in self._snapshots:
            data = self._open(url).get(key)
            arrays = load_arrays(data)
            factors = arrays["user_factors"].shape[1] if "user_factors" in arrays else 0
            self._snapshots[(url, key)] = (len(data), int(factors))
        return self._snapshots[(url, key)]

    def __call__(self, payload: dict[str, Any]) -> Work:
        for name in ("store_url", "shard_key"):
            if name not in payload:
                raise UncostablePayload(
                    f"the payload has no {name!r}: give the invocation a samples= label, "
                    "or the runtime a samples_of callable"
                )
        url = payload["store_url"]
        samples, shard_bytes, touched = self.shard(url, payload["shard_key"])
        snapshot_bytes, factors = 0, 0
        if "snapshot_key" in payload:
            snapshot_bytes, factors = self.snapshot(url, payload["snapshot_key"])
        return Work.for_shard(
            samples,
            payload.get("batch_size"),
            int(payload.get("local_epochs", 1)),
            bytes_read=shard_bytes + snapshot_bytes,
            bytes_written=8 * touched * (factors + 3),
        )

    def factors(self, url: str, snapshot_key: str) -> int:
        return self.snapshot(url, snapshot_key)[1]
