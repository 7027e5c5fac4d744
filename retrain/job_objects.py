"""What a distributed job keeps in the object store: model snapshots, the shards of its
window, the window archive and its checkpoint (layout: :mod:`retrain.checkpoints`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from functions.artifacts import (
    ArtifactError,
    dump_arrays,
    load_arrays,
    model_from_bytes,
    pack_arrays,
    sha256_hex,
)
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore
from functions.shards import job_prefixes, shard_key, snapshot_key, write_shard
from retrain.checkpoints import (
    CheckpointError,
    CheckpointState,
    checkpoint_key,
    checkpoint_prefix,
    get_verified,
    window_key,
)


@dataclass(frozen=True)
class EncodedWindow:
    """A job's training data, encoded as the model's rows, and the seeded shuffle
    ``order`` that splits it into shards."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    order: np.ndarray

    def shards(self, workers: int) -> list[np.ndarray]:
        """The rows of each of ``workers`` shards."""
        return np.array_split(self.order, workers)


class JobObjects:
    """Writes and reads back one job's objects, and deletes them when it ends.

    Snapshots are numbered and never overwritten (in-flight workers may still read older
    ones); ``snapshot`` writes one only when the model moved since the last.
    """

    def __init__(self, store: ObjectStore, job_id: str) -> None:
        self.store = store
        self.job_id = job_id
        #: The next snapshot's sequence number.
        self.snapshots = 0
        #: The worker count the window is split into in the store (0: none yet).
        self.sharded_for = 0
        # The snapshot holding the model as it is now, until an update changes it.
        self._current: tuple[str, str] | None = None
        self._window: tuple[str, str] | None = None

    def new_data(self) -> None:
        """The job was given a model and data: neither is in the store yet."""
        self._current = self._window = None

    def model_moved(self) -> None:
        """The model moved on from its last snapshot."""
        self._current = None

    def snapshot(self, model: BiasedMF) -> tuple[str, str]:
        """Key and SHA-256 of the snapshot of ``model`` as it is now, written if there
        is none yet. The one a checkpoint writes is the one the next epoch's workers
        pull."""
        if self._current is None:
            data = pack_arrays(model.to_arrays())
            key = snapshot_key(self.job_id, self.snapshots)
            self.snapshots += 1
            self.store.put(key, data)
            self._current = key, sha256_hex(data)
        return self._current

    def shard(self, workers: int, data: EncodedWindow) -> None:
        """Split the window into ``workers`` shards (once per distinct worker count)."""
        if self.sharded_for == workers:
            return
        for worker, rows in enumerate(data.shards(workers)):
            key = shard_key(self.job_id, worker, workers)
            write_shard(self.store, key, data.users[rows], data.items[rows], data.ratings[rows])
        self.sharded_for = workers

    def window(self, data: EncodedWindow) -> tuple[str, str]:
        """Key and SHA-256 of the window archive, written the first time."""
        if self._window is None:
            key = window_key(self.job_id)
            arrays = {
                "users": data.users,
                "items": data.items,
                "ratings": data.ratings,
                "order": data.order,
            }
            archive = dump_arrays(arrays)
            self.store.put(key, archive)
            self._window = key, sha256_hex(archive)
        return self._window

    def write_checkpoint(self, state: CheckpointState) -> str:
        """Write ``state`` as the job's checkpoint, last (it names only complete
        objects); returns its key."""
        key = checkpoint_key(self.job_id)
        self.store.put(key, state.to_json())
        return key

    def restore(self, state: CheckpointState) -> tuple[BiasedMF, EncodedWindow]:
        """The model and data ``state`` names, verified; the snapshot, window and shards
        are taken as the store has them.

        Raises
        ------
        CheckpointError
            If the snapshot or window is missing, damaged or inconsistent.
        """
        model_ref, window_ref = state.model, state.window
        try:
            model = model_from_bytes(get_verified(self.store, model_ref, "model snapshot"))
        except CheckpointError:
            raise
        except ArtifactError as exc:
            raise CheckpointError(f"model snapshot {model_ref.key!r}: {exc}") from exc
        try:
            arrays = load_arrays(get_verified(self.store, window_ref, "window"))
        except CheckpointError:
            raise
        except ArtifactError as exc:
            raise CheckpointError(f"window {window_ref.key!r}: {exc}") from exc
        missing = sorted({"users", "items", "ratings", "order"} - set(arrays))
        if missing:
            raise CheckpointError(f"window {window_ref.key!r} lacks arrays {missing}")
        users, items = arrays["users"].astype(np.int64), arrays["items"].astype(np.int64)
        ratings, order = arrays["ratings"].astype(np.float64), arrays["order"].astype(np.int64)
        n = len(ratings)
        if not (len(users) == len(items) == n and np.array_equal(np.sort(order), np.arange(n))):
            raise CheckpointError(f"window {window_ref.key!r} arrays disagree in length")
        if n and (users.max() >= model.n_users or items.max() >= model.n_items):
            raise CheckpointError(
                f"window {window_ref.key!r} does not fit snapshot {model_ref.key!r}"
            )
        self._current = (model_ref.key, model_ref.sha256)
        self._window = (window_ref.key, window_ref.sha256)
        self.snapshots = max(state.snapshot_seq, self._next_snapshot_in_store())
        split = state.split
        shards = [shard_key(self.job_id, w, split) for w in range(split)]
        self.sharded_for = split if all(self.store.exists(k) for k in shards) else 0
        return model, EncodedWindow(users, items, ratings, order)

    def _next_snapshot_in_store(self) -> int:
        """One past the highest snapshot in the store: a crashed coordinator may have
        written snapshots after its checkpoint, and snapshots are never overwritten."""
        prefix = snapshot_key(self.job_id, 0).rsplit("/", 1)[0] + "/"
        stems = (k[len(prefix) :].split(".", 1)[0] for k in self.store.list(prefix))
        numbers = [int(stem) for stem in stems if stem.isdigit()]
        return max(numbers, default=-1) + 1

    def cleanup(self, *, keep_checkpoint: bool = False) -> int:
        """Delete the job's objects; returns how many were deleted. With
        ``keep_checkpoint`` its checkpoint and window archive stay."""
        prefixes = list(job_prefixes(self.job_id))
        if not keep_checkpoint:
            prefixes.append(checkpoint_prefix(self.job_id))
        return sum(self.store.delete_prefix(prefix) for prefix in prefixes)
