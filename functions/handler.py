"""The retraining worker: one worker of one epoch of distributed SGD, as a Lambda handler.

Each epoch the coordinator writes the model snapshot φ_t to the object store and invokes
λ workers (``docs/architecture.md``, "Retraining"; SandPiper (Ali et al.), §III-B).
A worker

1. pulls φ_t and its data shard (see :mod:`functions.shards`) from the store,
2. measures the mean squared error on its shard,
3. runs ``local_epochs`` passes of shuffled minibatch SGD over the shard
   (:func:`functions.mf_sgd.sgd_step` through a :mod:`functions.trainers` trainer, one
   minibatch at a time so that it can stop between minibatches when the function's
   time runs out),
4. measures the error again and pushes its update, ``trained - snapshot`` on the rows
   its shard touched, to ``delta_key``, where the coordinator averages the first κ
   workers' deltas into φ_{t+1} (:func:`functions.shards.average_deltas`).

The handler has AWS Lambda's signature, so the same code runs on Lambda (handler setting
``lambda_function.handler`` in the package ``driftline package-function`` builds) and in
the local runtime (``functions.handler:handler``).

Event (a JSON object; every field is checked and an error names the bad one):

==================  ========  ====================================================
field               default   meaning
==================  ========  ====================================================
``store_url``                 object store URL: ``file:///...``, ``s3://...``
``job_id``                    the retraining job (echoed back)
``epoch``                     epoch number t >= 0 (echoed back, seeds the shuffle)
``worker``                    worker index >= 0 (echoed back, seeds the shuffle)
``snapshot_key``              key of φ_t, a :func:`functions.artifacts.model_to_bytes`
``shard_key``                 key of the worker's shard
``delta_key``                 key to write the worker's delta to
``batch_size``                samples per minibatch, >= 1
``learning_rate``             SGD step, > 0 (replaces the snapshot's)
``regularization``            L2 penalty, >= 0 (replaces the snapshot's)
``local_epochs``    1         passes over the shard, >= 1
``seed``            0         shuffle seed; the generator is seeded with
                              (seed, epoch, worker), so one job-wide seed gives each
                              worker and epoch its own order and a retried
                              invocation repeats its work exactly
``snapshot_sha256`` None      if given, the snapshot's bytes must have this checksum
``time_margin_s``   20.0      stop training once less than this (plus the slowest
                              minibatch so far) is left of the invocation's time
==================  ========  ====================================================

Lambda stops a function at its timeout (at most 900 s; MLLess and SMLT both design
around it), losing all work. When ``context`` offers ``get_remaining_time_in_millis``
the worker checks it after every minibatch and, with less than ``time_margin_s`` plus
one more minibatch left, stops, writes the delta of the work done so far (its rows are
then only those of the minibatches it ran) and reports ``"stopped_early": true``.
At least one minibatch always runs, so a retried worker makes progress.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any

import numpy as np

from functions.artifacts import model_from_bytes, sha256_hex
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore, open_object_store, validate_key
from functions.shards import make_delta, read_shard, snapshot_rows, write_delta
from functions.trainers import NumpyTrainer, TrainerFactory

__all__ = [
    "EventError",
    "TrainingDiverged",
    "WorkerTask",
    "handler",
    "parse_event",
    "peak_memory_mb",
    "run_worker",
]


class EventError(ValueError):
    """The event is malformed; ``field`` names the offending field (None: the whole event)."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(f"event field {field!r}: {message}" if field else f"event: {message}")
        self.field = field


class TrainingDiverged(RuntimeError):
    """Training produced NaN or inf; no delta is written (it would poison the average)."""


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise EventError(name, f"must be an integer >= {minimum}, got {value!r}")


def _require_real(name: str, value: object, positive: bool) -> None:
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if number is not None and math.isfinite(number) and (number > 0 if positive else number >= 0):
        return
    bound = "> 0" if positive else ">= 0"
    raise EventError(name, f"must be a finite number {bound}, got {value!r}")


def _require_str(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise EventError(name, f"must be a non-empty string, got {value!r}")


@dataclass(frozen=True)
class WorkerTask:
    """A validated worker event; see the module docstring for the fields.

    Constructing one checks every field (:class:`EventError` names a bad one), so a
    coordinator can build a ``WorkerTask`` and send :meth:`as_event`.
    """

    store_url: str
    job_id: str
    epoch: int
    worker: int
    snapshot_key: str
    shard_key: str
    delta_key: str
    batch_size: int
    learning_rate: float
    regularization: float
    local_epochs: int = 1
    seed: int = 0
    snapshot_sha256: str | None = None
    time_margin_s: float = 20.0

    def __post_init__(self) -> None:
        _require_str("store_url", self.store_url)
        _require_str("job_id", self.job_id)
        _require_int("epoch", self.epoch, 0)
        _require_int("worker", self.worker, 0)
        for name in ("snapshot_key", "shard_key", "delta_key"):
            value = getattr(self, name)
            try:
                validate_key(value)
            except ValueError as exc:
                raise EventError(name, str(exc)) from None
        if self.delta_key in (self.snapshot_key, self.shard_key):
            raise EventError("delta_key", "must differ from snapshot_key and shard_key")
        _require_int("batch_size", self.batch_size, 1)
        _require_real("learning_rate", self.learning_rate, positive=True)
        _require_real("regularization", self.regularization, positive=False)
        _require_int("local_epochs", self.local_epochs, 1)
        _require_int("seed", self.seed, 0)
        digest = self.snapshot_sha256
        if digest is not None and (
            not isinstance(digest, str)
            or len(digest) != 64
            or any(c not in "0123456789abcdef" for c in digest.lower())
        ):
            raise EventError("snapshot_sha256", f"must be a hex SHA-256 or null, got {digest!r}")
        _require_real("time_margin_s", self.time_margin_s, positive=False)

    def as_event(self) -> dict[str, Any]:
        """The JSON-serialisable event that :func:`parse_event` turns back into this task."""
        return asdict(self)


_FIELDS = {f.name: f for f in fields(WorkerTask)}
_REQUIRED = [name for name, f in _FIELDS.items() if f.default is MISSING]


def parse_event(event: object) -> WorkerTask:
    """Check a worker event and return it as a :class:`WorkerTask`.

    Raises
    ------
    EventError
        If the event is not a dict, lacks a required field, has a field this worker
        does not know (a typo would otherwise be ignored silently), or has a bad value;
        the error's ``field`` names it.
    """
    if not isinstance(event, dict):
        raise EventError(None, f"must be a JSON object (dict), got {type(event).__name__}")
    for name in _REQUIRED:
        if name not in event:
            raise EventError(name, "is required but missing")
    unknown = sorted(str(k) for k in event if k not in _FIELDS)
    if unknown:
        raise EventError(unknown[0], f"is not a worker event field (unknown: {unknown})")
    return WorkerTask(**event)


def peak_memory_mb() -> float | None:
    """Peak resident memory of this process in MiB, from ``getrusage``'s ``ru_maxrss``.

    On Lambda the process is the execution environment, so this is the environment's
    peak since it started: this invocation's peak on a cold start, and at least it on a
    warm one (earlier invocations of the same environment count too), which is what the
    function's memory size has to cover. None where ``resource`` does not exist (Windows).
    """
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0  # bytes, KiB


@functools.lru_cache(maxsize=8)
def _store(url: str) -> ObjectStore:
    # Warm invocations reuse their store (and an S3 client's connection pool).
    return open_object_store(url)


def _remaining_s(context: object) -> Callable[[], float] | None:
    get = getattr(context, "get_remaining_time_in_millis", None)
    if not callable(get):
        return None
    return lambda: float(get()) / 1000.0


def run_worker(
    task: WorkerTask,
    store: ObjectStore | None = None,
    context: object = None,
    trainer: TrainerFactory = NumpyTrainer,
) -> tuple[dict[str, Any], BiasedMF]:
    """Run `task` (see :func:`handler`) and return its result and the trained model.

    `store` defaults to the one ``task.store_url`` names; `trainer` holds the shard and
    does its arithmetic (:mod:`functions.trainers`). The trained model is what the delta
    written to ``task.delta_key`` turns the snapshot into, on the delta's rows.
    """
    started = time.perf_counter()
    store = _store(task.store_url) if store is None else store
    snapshot = store.get(task.snapshot_key)
    model = model_from_bytes(snapshot, task.snapshot_sha256)
    shard = read_shard(store, task.shard_key)
    u, i, r = shard
    if len(r) == 0:
        raise EventError("shard_key", f"shard {task.shard_key!r} holds no ratings")
    for name, rows, size in (("users", u, model.n_users), ("items", i, model.n_items)):
        if rows.max() >= size:
            raise EventError(
                "shard_key",
                f"shard {task.shard_key!r} {name} reach row {int(rows.max())} but the snapshot "
                f"has {size} {name}; shards must be encoded against the snapshot",
            )
    model.learning_rate = float(task.learning_rate)
    model.regularization = float(task.regularization)

    shard_trainer = trainer(model, u, i, r)
    loss_before = shard_trainer.mse()
    before = snapshot_rows(model, *shard_trainer.rows())
    rng = np.random.default_rng([task.seed, task.epoch, task.worker])
    remaining = _remaining_s(context)
    n, batch_size = len(r), task.batch_size
    sse = 0.0
    samples_trained = epochs_completed = 0
    first_epoch_order = None
    slowest = 0.0
    stopped_early = False
    for epoch in range(task.local_epochs):
        order = rng.permutation(n)
        if epoch == 0:
            first_epoch_order = order
        shard_trainer.shuffle(order)
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            tick = time.perf_counter()
            loss = shard_trainer.step(start, stop)
            slowest = max(slowest, time.perf_counter() - tick)
            sse += loss * (stop - start)
            samples_trained += stop - start
            more_to_do = start + batch_size < n or epoch + 1 < task.local_epochs
            if more_to_do and remaining is not None and remaining() < task.time_margin_s + slowest:
                stopped_early = True
                break
        if stopped_early:
            break
        epochs_completed += 1
    train_loss = sse / samples_trained
    shard_trainer.sync()

    if epochs_completed:
        user_rows, item_rows = before["user_rows"], before["item_rows"]
    else:  # stopped inside the first pass: only the minibatches that ran moved rows
        assert first_epoch_order is not None  # set when the first pass starts
        done = first_epoch_order[:samples_trained]
        user_rows, item_rows = np.unique(u[done]), np.unique(i[done])
    loss_after = shard_trainer.mse()
    delta = make_delta(before, model, user_rows, item_rows)
    finite = all(np.isfinite(a).all() for a in delta.values())
    if not (finite and math.isfinite(loss_after) and math.isfinite(train_loss)):
        raise TrainingDiverged(
            f"job {task.job_id!r} epoch {task.epoch} worker {task.worker}: training "
            f"diverged (loss {loss_before:.4g} -> {loss_after:.4g}) with learning_rate="
            f"{task.learning_rate}, batch_size={task.batch_size}; no delta written"
        )
    delta_sha256 = write_delta(store, task.delta_key, delta)

    result: dict[str, Any] = {
        "job_id": task.job_id,
        "epoch": task.epoch,
        "worker": task.worker,
        "delta_key": task.delta_key,
        "delta_sha256": delta_sha256,
        "snapshot_sha256": sha256_hex(snapshot),
        "samples": n,
        "samples_trained": samples_trained,
        "epochs_completed": epochs_completed,
        "users_touched": len(user_rows),
        "items_touched": len(item_rows),
        "loss_before": float(loss_before),
        "loss_after": float(loss_after),
        "train_loss": float(train_loss),
        "stopped_early": stopped_early,
        "duration_s": time.perf_counter() - started,
        "peak_memory_mb": peak_memory_mb(),
    }
    return result, model


def handler(event: dict, context: Any) -> dict:
    """AWS Lambda entry point: run one worker of one epoch; see the module docstring.

    Returns a JSON-serialisable dict: ``job_id``, ``epoch``, ``worker`` and
    ``delta_key`` echoed; ``samples`` (ratings in the shard), ``samples_trained`` (SGD
    updates made, ``samples * local_epochs`` unless stopped early); ``loss_before`` and
    ``loss_after`` (mean squared error on the whole shard before and after training);
    ``train_loss`` (the running minibatch loss); ``stopped_early``; ``users_touched`` and
    ``items_touched`` (rows in the delta); ``delta_sha256`` and ``snapshot_sha256``;
    ``duration_s`` (wall time of the whole invocation); ``peak_memory_mb``
    (:func:`peak_memory_mb`).

    Raises
    ------
    EventError
        For a malformed event or a shard that does not fit the snapshot.
    TrainingDiverged
        If training produced NaN or inf.
    functions.objectstore.ObjectNotFound, functions.artifacts.ArtifactError
        If the snapshot or shard is missing, damaged or fails its checksum.
    """
    result, _ = run_worker(parse_event(event), context=context)
    return result
