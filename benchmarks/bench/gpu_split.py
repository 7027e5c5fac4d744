"""``driftline bench gpu``'s worker split: how much of the numpy worker's invocation is
its minibatch steps, the only part the torch worker moves to a GPU.

A worker invocation (:func:`functions.handler.run_worker`) reads its snapshot and shard,
scores the whole shard before and after training (``loss_before``, ``loss_after``),
shuffles and slices it into minibatches, takes the steps, and writes the delta of the
rows it touched. The torch worker (:mod:`functions.gpu`) runs the same invocation with
its own stepper: everything but the steps stays on the host's CPU. So a GPU's speed-up
on the steps (what :func:`benchmarks.bench.gpu.measure_window` measures) is not its
speed-up on a worker; by Amdahl's law the host part bounds it.

Measured here: the real numpy worker on a synthetic shard in a ``file://`` store, and
the same invocation with a stepper that does nothing (the host part), the fastest of
``repeats`` each. ``host_share`` is the host part's share of the worker's seconds;
``host_s_per_sample`` the host part per rating of the shard.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.bench.gpu import synthetic_window
from functions.artifacts import model_to_bytes
from functions.handler import NumpyStepper, WorkerTask, run_worker
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore, open_object_store
from functions.shards import delta_key, shard_key, snapshot_key, write_shard

JOB = "split"


class HostOnlyStepper:
    """A stepper that takes no step: the invocation's host part alone."""

    def __init__(self, model: BiasedMF, rng: np.random.Generator) -> None:
        self.model = model

    def step(self, u: np.ndarray, i: np.ndarray, r: np.ndarray) -> float:
        return 0.0

    def sync(self) -> None:
        return None


def _fastest(
    store: ObjectStore,
    url: str,
    batch: int,
    stepper: Callable[[BiasedMF, np.random.Generator], Any],
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
        run_worker(task, store, None, stepper)
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
        rows = []
        for b in batch_sizes:
            worker = _fastest(store, url, b, NumpyStepper, repeats)
            host = _fastest(store, url, b, HostOnlyStepper, repeats)
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


__all__ = ["HostOnlyStepper", "measure_worker_split"]
