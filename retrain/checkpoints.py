"""Checkpoints of the distributed coordinator, so a crashed job resumes.

At the end of every epoch the coordinator writes the model φ_{t+1} as the next snapshot
(which the following epoch's workers then pull, so checkpointing writes no extra
snapshots), and then ``checkpoints/<job>/latest.json``, atomically (the store's ``put``)
and last, so the checkpoint only ever names complete objects. The encoded training data
is written once, to ``checkpoints/<job>/window.npz`` (``users``, ``items``, ``ratings``
and the shuffle ``order`` that splits it into shards). The JSON object holds

``format_version``, ``job_id``, ``written_at``
    :data:`CHECKPOINT_FORMAT_VERSION`, the job, a Unix time.
``next_epoch``
    Epochs finished so far, hence the number of the next one.
``snapshot_seq``
    The next snapshot sequence number (ASP writes more than one snapshot an epoch).
``model``, ``window``
    ``{"key", "sha256"}`` of the model snapshot and of the window archive.
``split``
    The number of shards the window is currently split into (0: none yet).
``seed``, ``policy``, ``timeout_s``, ``max_retries``
    The coordinator's settings; the seed fixes the shard order and every worker's
    shuffle (a worker seeds with ``(seed, epoch, worker)``), so it is the whole of the
    random state a resumed job needs.
``in_flight``
    Invocations still running: ``worker``, ``epoch``, ``attempt``, ``memory_mb``, the
    worker ``kind`` it runs on (absent in older checkpoints: Lambda's) and the worker
    ``task`` (its event: snapshot, shard and delta keys, batch size, ...).
``epochs``
    The job's :class:`retrain.job.EpochRecord` so far: loss, duration, config, cost.
``stats``
    :class:`CoordinatorStats`: ``used`` updates, ``failures`` and ``invocations``.

:meth:`DistributedBackend.resume` rebuilds a coordinator from it: the model from the
snapshot and the data from the window archive, both verified against their SHA-256
(:class:`CheckpointError`, naming the key, if either is missing or damaged). Work that
was in flight is not lost: a delta already in the store (a straggler that finished after
the crash; on Lambda an invocation outlives its caller) counts as an invocation that has
finished, so the next epoch collects it like any arrival, as a stale update; a missing
(or unreadable) one is relaunched with its original task, which recomputes the same
update (worker shuffles are seeded), so even a racing original invocation writes
identical bytes to the same key. ``retrain.job.run_training`` then
continues the job with ``history=backend.epochs, prepare=False``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from configurator.space import LAMBDA
from functions.artifacts import ArtifactError, sha256_hex
from functions.handler import WorkerTask
from functions.objectstore import ObjectNotFound, ObjectStore, validate_key
from functions.shards import snapshot_key

#: Version of the checkpoint layout described above.
CHECKPOINT_FORMAT_VERSION = 1


class CheckpointError(ArtifactError):
    """A checkpoint, or an object it names, is missing, damaged or inconsistent."""


def checkpoint_key(job_id: str) -> str:
    """``checkpoints/<job>/latest.json``: the coordinator's state after its last epoch."""
    return validate_key(f"checkpoints/{_job_component(job_id)}/latest.json")


def checkpoint_prefix(job_id: str) -> str:
    """``checkpoints/<job>/``: everything a job needs to resume (checkpoint and window)."""
    return f"checkpoints/{_job_component(job_id)}/"


def window_key(job_id: str) -> str:
    """``checkpoints/<job>/window.npz``: the job's encoded training data, written once."""
    return validate_key(f"checkpoints/{_job_component(job_id)}/window.npz")


def _job_component(job_id: str) -> str:
    snapshot_key(job_id, 0)  # the same rule as the other per-job keys
    return job_id


@dataclass(frozen=True)
class ObjectRef:
    """An object a checkpoint names, with the SHA-256 it must still have."""

    key: str
    sha256: str


@dataclass(frozen=True)
class InFlight:
    """An invocation running when the checkpoint was written."""

    worker: int
    epoch: int
    attempt: int
    memory_mb: int
    task: WorkerTask
    kind: str = LAMBDA


@dataclass(frozen=True)
class CheckpointState:
    """The coordinator between two epochs; the fields are described in the module
    docstring. ``epochs`` and ``stats`` stay plain JSON here: the coordinator owns their
    types (``EpochRecord``, ``CoordinatorStats``) and rebuilds them."""

    job_id: str
    written_at: float
    next_epoch: int
    snapshot_seq: int
    model: ObjectRef
    window: ObjectRef
    split: int
    seed: int
    policy_name: str
    policy_ratio: float
    timeout_s: float
    max_retries: int
    in_flight: tuple[InFlight, ...]
    epochs: tuple[dict[str, Any], ...]
    stats: dict[str, Any]

    def to_json(self) -> bytes:
        state = {
            "format_version": CHECKPOINT_FORMAT_VERSION,
            "job_id": self.job_id,
            "written_at": self.written_at,
            "next_epoch": self.next_epoch,
            "snapshot_seq": self.snapshot_seq,
            "model": dataclasses.asdict(self.model),
            "window": dataclasses.asdict(self.window),
            "split": self.split,
            "seed": self.seed,
            "policy": {"name": self.policy_name, "ratio": self.policy_ratio},
            "timeout_s": self.timeout_s,
            "max_retries": self.max_retries,
            "in_flight": [
                {
                    "worker": f.worker,
                    "epoch": f.epoch,
                    "attempt": f.attempt,
                    "memory_mb": f.memory_mb,
                    "kind": f.kind,
                    "task": f.task.as_event(),
                }
                for f in self.in_flight
            ],
            "epochs": list(self.epochs),
            "stats": self.stats,
        }
        return json.dumps(state, sort_keys=True, default=json_scalar).encode()

    @classmethod
    def from_json(cls, state: dict[str, Any], key: str, store_url: str) -> CheckpointState:
        """The state in a decoded checkpoint; ``CheckpointError`` naming ``key`` if a
        field is missing or of the wrong kind. In-flight tasks read and write the store
        as ``store_url`` names it now."""
        try:
            return cls(
                job_id=str(state["job_id"]),
                written_at=float(state["written_at"]),
                next_epoch=int(state["next_epoch"]),
                snapshot_seq=int(state["snapshot_seq"]),
                model=ObjectRef(str(state["model"]["key"]), str(state["model"]["sha256"])),
                window=ObjectRef(str(state["window"]["key"]), str(state["window"]["sha256"])),
                split=int(state["split"]),
                seed=int(state["seed"]),
                policy_name=str(state["policy"]["name"]),
                policy_ratio=float(state["policy"]["ratio"]),
                timeout_s=float(state["timeout_s"]),
                max_retries=int(state["max_retries"]),
                in_flight=tuple(_in_flight(entry, store_url) for entry in state["in_flight"]),
                epochs=tuple(dict(e) for e in state["epochs"]),
                stats=dict(state["stats"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise CheckpointError(f"checkpoint {key!r} is malformed: {detail}") from exc


def _in_flight(entry: dict[str, Any], store_url: str) -> InFlight:
    task = WorkerTask(**{**entry["task"], "store_url": store_url})
    return InFlight(
        int(entry["worker"]),
        int(entry["epoch"]),
        int(entry["attempt"]),
        int(entry["memory_mb"]),
        task,
        str(entry.get("kind", LAMBDA)),
    )


def read_checkpoint(
    store: ObjectStore, job_id: str, store_url: str | None = None
) -> CheckpointState | None:
    """The job's latest checkpoint, None if it has none.

    Raises
    ------
    CheckpointError
        If the object is not a checkpoint of this job in a format this code reads.
    """
    key = checkpoint_key(job_id)
    try:
        data = store.get(key)
    except ObjectNotFound:
        return None
    try:
        state = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {key!r} is not valid JSON: {exc}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {key!r} is not a JSON object")
    version = state.get("format_version")
    if version != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {key!r} has format_version {version!r}; "
            f"this code reads version {CHECKPOINT_FORMAT_VERSION}"
        )
    if state.get("job_id") != job_id:
        raise CheckpointError(f"checkpoint {key!r} belongs to job {state.get('job_id')!r}")
    return CheckpointState.from_json(state, key, store_url or store.url)


def get_verified(store: ObjectStore, ref: ObjectRef, what: str) -> bytes:
    """The bytes a checkpoint refers to, checked against the SHA-256 it recorded."""
    key, expected = ref.key, ref.sha256
    try:
        data = store.get(key)
    except ObjectNotFound as exc:
        raise CheckpointError(f"the checkpoint's {what} {key!r} is missing") from exc
    if sha256_hex(data) != expected.lower():
        raise CheckpointError(
            f"the checkpoint's {what} {key!r} is damaged: sha256 {sha256_hex(data)}, "
            f"the checkpoint recorded {expected}"
        )
    return data


def json_scalar(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
