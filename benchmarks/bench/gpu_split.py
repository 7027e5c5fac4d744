"""``driftline bench gpu``'s worker split: how much of the numpy worker's invocation stays
on the host when its arithmetic moves to a device.

A worker invocation (:func:`functions.handler.run_worker`) reads its snapshot and shard,
hands the shard to a trainer (:mod:`functions.trainers`) that scores it before and
after training, finds its rows and takes the steps, draws one permutation per epoch,
and writes the delta of the rows it touched. The torch trainer (:mod:`functions.gpu`)
does the per-rating work on its device; the reads, the permutations and the delta stay
on the host's CPU, and by Amdahl's law they bound a GPU's speed-up of a whole worker.

Measured here: the real numpy worker on a synthetic shard in a ``file://`` store, and
the same invocation with a trainer that computes nothing (the host part), the fastest
of ``repeats`` each. ``host_share`` is the host part's share of the numpy worker's
seconds; ``host_s_per_sample`` the host part per rating of the shard.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.bench.gpu import synthetic_window
from functions.artifacts import model_to_bytes
from functions.handler import WorkerTask, run_worker
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore, open_object_store
from functions.shards import delta_key, shard_key, snapshot_key, write_shard
from functions.trainers import NumpyTrainer, TrainerFactory

JOB = "split"


class HostOnlyTrainer:
    """A trainer that computes nothing: the invocation's host part alone. It reports
    the shard's ``rows`` given to it (found before the clock starts), as a device would
    hand them back."""

    def __init__(
        self,
        model: BiasedMF,
        users: np.ndarray,
        items: np.ndarray,
        ratings: np.ndarray,
        *,
        rows: tuple[np.ndarray, np.ndarray],
    ) -> None:
        self._rows = rows

    def mse(self) -> float:
        return 0.0

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        return self._rows

    def shuffle(self, order: np.ndarray) -> None:
        return None

    def step(self, start: int, stop: int) -> float:
        return 0.0

    def sync(self) -> None:
        return None


def _fastest(
    store: ObjectStore,
    url: str,
    batch: int,
    trainer: TrainerFactory,
    repeats: int,
) -> float:
    times = []
    for k in range(repeats):
        task = WorkerTask(
            url,
            JOB,
            k,
            0,
            snapshot_key(JOB, 0),
            shard_key(JOB, 0, 1),
            delta_key(JOB, k, 0),
            batch,
            0.05,
            0.05,
        )
        tick = time.perf_counter()
        run_worker(task, store, None, trainer)
        times.append(time.perf_counter() - tick)
    return min(times)


def measure_worker_split(
    n: int, batch_sizes: Sequence[int], repeats: int = 2, seed: int = 0
) -> dict[str, Any]:
    """The numpy worker's seconds on a shard of ``n`` ratings and its host part's, per
    batch size; ``host_share`` and ``host_s_per_sample`` are their medians."""
    model, users, items, ratings = synthetic_window(n, seed)
    with tempfile.TemporaryDirectory() as root:
        url = f"file://{root}"
        store = open_object_store(url)
        write_shard(store, shard_key(JOB, 0, 1), users, items, ratings)
        store.put(snapshot_key(JOB, 0), model_to_bytes(model))
        host_only = functools.partial(HostOnlyTrainer, rows=(np.unique(users), np.unique(items)))
        rows = []
        for b in batch_sizes:
            worker = _fastest(store, url, b, NumpyTrainer, repeats)
            host = _fastest(store, url, b, host_only, repeats)
            rows.append({"batch_size": b, "worker_s": worker, "host_s": host})
    for row in rows:
        row["host_share"] = row["host_s"] / row["worker_s"]
    return {
        "window": n,
        "repeats": repeats,
        "results": rows,
        "host_share": statistics.median(r["host_share"] for r in rows),
        "host_s_per_sample": statistics.median(r["host_s"] for r in rows) / n,
    }


__all__ = ["HostOnlyTrainer", "measure_worker_split"]
