"""Data shards and model deltas: what the coordinator and its workers exchange.

A distributed retraining epoch (``docs/architecture.md``, "Retraining"; SandPiper's DSGD
step) moves three kinds of object through the object store: the model snapshot φ_t (a
model artifact, see :mod:`functions.artifacts`), one data **shard** per worker, and one
**delta** per worker that the coordinator averages into φ_{t+1}.

Shard
    An ``.npz`` archive with ``users`` and ``items`` (int64 row indices into the
    snapshot model, so a worker needs no id maps) and ``ratings`` (float64), one entry
    per rating. Written by :func:`write_shard`, read by :func:`read_shard`.

Delta
    A worker's update, ``trained - snapshot``, restricted to the rows its shard touched
    so it stays small however large the model is. Arrays (see :func:`check_delta`):

    ``format_version``
        0-d int64, :data:`DELTA_FORMAT_VERSION`.
    ``user_rows``, ``item_rows``
        int64, sorted and unique: the model rows the delta covers.
    ``user_bias``, ``item_bias``
        float64, one change per row.
    ``user_factors``, ``item_factors``
        float64, (rows x factors): one change per row.
    ``user_count``, ``item_count``
        int64 >= 1 per row: how many workers' updates the row's change averages; 1 in
        a single worker's delta. :func:`average_deltas` weights by it, so averaging
        averaged deltas gives the same result as averaging all the workers at once.

Rows a worker did not touch are absent from its delta, and averaging follows model
averaging: each row is the mean over the workers that touched it, not over all workers,
so a row seen by one worker is not shrunk by the others' absence.

Key layout (see :mod:`functions.objectstore`): :func:`snapshot_key`, :func:`shard_key` and
:func:`delta_key` build the conventional keys; the worker itself is told its keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from functions.artifacts import ArtifactError, dump_arrays, load_arrays, pack_arrays, sha256_hex
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore, validate_key

__all__ = [
    "DELTA_FORMAT_VERSION",
    "Shard",
    "apply_delta",
    "average_deltas",
    "check_delta",
    "delta_key",
    "make_delta",
    "read_delta",
    "read_shard",
    "shard_key",
    "snapshot_key",
    "snapshot_rows",
    "write_delta",
    "write_shard",
]

#: Version of the delta layout described in the module docstring.
DELTA_FORMAT_VERSION = 1

_SIDES = ("user", "item")


class Shard(NamedTuple):
    """One worker's ratings, encoded against the snapshot model."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:  # the number of ratings, not of fields
        return len(self.ratings)


# -- keys -------------------------------------------------------------------------------

#: The suffix of snapshot and delta keys: packed arrays, not ``.npz``.
EXCHANGE_SUFFIX = "pack"


def snapshot_key(job_id: str, epoch: int) -> str:
    """``snapshots/<job>/<epoch:06d>.pack``: the model φ_t the epoch's workers pull.

    Snapshots and deltas, exchanged λ times an epoch, are packed arrays
    (:func:`functions.artifacts.pack_arrays`); shards, written once, are ``.npz``.
    """
    job, e = _component("job_id", job_id), _index("epoch", epoch)
    return validate_key(f"snapshots/{job}/{e}.{EXCHANGE_SUFFIX}")


def shard_key(job_id: str, worker: int, workers: int) -> str:
    """``shards/<job>/<worker:05d>-of-<workers:05d>.npz``: shard `worker` of a `workers`-way split.

    The split is part of the key because the number of workers may change between
    epochs, and each split of the job's window is a separate set of shards.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not isinstance(worker, int) or isinstance(worker, bool) or not 0 <= worker < workers:
        raise ValueError(f"worker must be an integer in [0, {workers}), got {worker!r}")
    job = _component("job_id", job_id)
    return validate_key(f"shards/{job}/{worker:05d}-of-{workers:05d}.npz")


def job_prefixes(job_id: str) -> tuple[str, str, str]:
    """The key prefixes of a job's snapshots, shards and deltas, for deleting them."""
    job = _component("job_id", job_id)
    return f"snapshots/{job}/", f"shards/{job}/", f"deltas/{job}/"


def delta_key(job_id: str, epoch: int, worker: int) -> str:
    """``deltas/<job>/<epoch:06d>/<worker:05d>.pack``: a worker's update in an epoch."""
    job, e = _component("job_id", job_id), _index("epoch", epoch)
    return validate_key(f"deltas/{job}/{e}/{_index('worker', worker, width=5)}.{EXCHANGE_SUFFIX}")


def _component(name: str, value: str) -> str:
    if not isinstance(value, str) or not value or "/" in value:
        raise ValueError(f"{name} must be a non-empty string without '/', got {value!r}")
    validate_key(value)
    return value


def _index(name: str, value: int, width: int = 6) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return f"{value:0{width}d}"


# -- shards -----------------------------------------------------------------------------


def write_shard(
    store: ObjectStore,
    key: str,
    users: Sequence[int] | np.ndarray,
    items: Sequence[int] | np.ndarray,
    ratings: Sequence[float] | np.ndarray,
) -> str:
    """Store a shard under `key`; returns the SHA-256 of the bytes written.

    `users` and `items` are rows of the snapshot model (``model.encode_users(ids)``),
    all >= 0; `ratings` are finite. ValueError if they are not, or differ in length.
    """
    shard = _check_shard(users, items, ratings)
    data = dump_arrays(shard._asdict())
    store.put(key, data)
    return sha256_hex(data)


def read_shard(store: ObjectStore, key: str) -> Shard:
    """The shard stored under `key` (ObjectNotFound if none, ArtifactError if malformed)."""
    arrays = load_arrays(store.get(key))
    missing = [name for name in Shard._fields if name not in arrays]
    if missing:
        raise ArtifactError(f"shard {key!r} lacks arrays {missing}")
    try:
        return _check_shard(arrays["users"], arrays["items"], arrays["ratings"])
    except ValueError as exc:
        raise ArtifactError(f"shard {key!r} is malformed: {exc}") from exc


def _check_shard(users: object, items: object, ratings: object) -> Shard:
    rows = {}
    for name, value in (("users", users), ("items", items)):
        a = np.asarray(value)
        if a.ndim != 1 or not (a.dtype.kind in "iu" or a.size == 0):
            raise ValueError(f"shard {name} must be a 1-D integer array, got {a.dtype} {a.shape}")
        a = a.astype(np.int64, copy=False)
        if a.size and a.min() < 0:
            raise ValueError(f"shard {name} must be model rows >= 0")
        rows[name] = a
    r = np.asarray(ratings)
    if r.ndim != 1 or not (r.dtype.kind in "iuf" or r.size == 0):
        raise ValueError(f"shard ratings must be a 1-D numeric array, got {r.dtype} {r.shape}")
    r = r.astype(np.float64, copy=False)
    if not np.isfinite(r).all():
        raise ValueError("shard ratings must be finite (no NaN or inf)")
    if not len(rows["users"]) == len(rows["items"]) == len(r):
        raise ValueError(
            "shard users, items and ratings must have the same length, got "
            f"{len(rows['users'])}, {len(rows['items'])} and {len(r)}"
        )
    return Shard(rows["users"], rows["items"], r)


# -- deltas -----------------------------------------------------------------------------


def make_delta(
    before: Mapping[str, np.ndarray], trained: BiasedMF, user_rows: object, item_rows: object
) -> dict[str, np.ndarray]:
    """The delta ``trained - before`` on the given rows.

    Parameters
    ----------
    before
        The snapshot's values on a superset of the rows: ``user_rows``, ``user_bias``,
        ``user_factors`` and the same for items, with the rows sorted and unique (as
        :func:`snapshot_rows` returns them). Copying only these rows before training
        avoids keeping a second copy of the whole model.
    trained
        The model after training.
    user_rows, item_rows
        Rows the delta covers, each one of ``before``'s rows.
    """
    delta: dict[str, np.ndarray] = {
        "format_version": np.array(DELTA_FORMAT_VERSION, dtype=np.int64)
    }
    for side, rows in zip(_SIDES, (user_rows, item_rows), strict=True):
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        known = np.asarray(before[f"{side}_rows"], dtype=np.int64)
        at = np.searchsorted(known, rows)
        if rows.size and (at.max() >= len(known) or not np.array_equal(known[at], rows)):
            raise ValueError(f"{side}_rows must be a subset of the snapshot rows given")
        bias = getattr(trained, f"{side}_bias")
        factors = getattr(trained, f"{side}_factors")
        delta[f"{side}_rows"] = rows
        delta[f"{side}_bias"] = bias[rows] - before[f"{side}_bias"][at]
        delta[f"{side}_factors"] = factors[rows] - before[f"{side}_factors"][at]
        delta[f"{side}_count"] = np.ones(len(rows), dtype=np.int64)
    return delta


def snapshot_rows(model: BiasedMF, user_rows: object, item_rows: object) -> dict[str, np.ndarray]:
    """Copies of `model`'s biases and factors on the given rows (sorted, unique).

    The ``before`` argument of :func:`make_delta`.
    """
    out: dict[str, np.ndarray] = {}
    for side, rows in zip(_SIDES, (user_rows, item_rows), strict=True):
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        out[f"{side}_rows"] = rows
        out[f"{side}_bias"] = getattr(model, f"{side}_bias")[rows].copy()
        out[f"{side}_factors"] = getattr(model, f"{side}_factors")[rows].copy()
    return out


def check_delta(delta: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`delta` with its arrays normalised to the documented dtypes; ValueError if malformed.

    Checks the format version, that each side's arrays agree in length, that rows are
    sorted, unique and >= 0, that counts are >= 1, that both sides have the same number
    of factors and that every change is finite (a diverged worker must not poison an
    average).
    """
    if "format_version" not in delta:
        raise ValueError("delta lacks 'format_version'")
    version = np.asarray(delta["format_version"])
    if version.shape != () or version.dtype.kind not in "iu":
        raise ValueError(f"delta format_version must be an integer scalar, got {version!r}")
    if int(version) != DELTA_FORMAT_VERSION:
        raise ValueError(
            f"unsupported delta format_version {int(version)}; "
            f"this code reads version {DELTA_FORMAT_VERSION}"
        )
    out: dict[str, np.ndarray] = {"format_version": np.array(int(version), dtype=np.int64)}
    widths = set()
    for side in _SIDES:
        names = [f"{side}_{part}" for part in ("rows", "bias", "factors", "count")]
        missing = [name for name in names if name not in delta]
        if missing:
            raise ValueError(f"delta lacks {missing}")
        rows, bias, factors, count = (np.asarray(delta[name]) for name in names)
        n = len(rows) if rows.ndim == 1 else -1
        if rows.ndim != 1 or not (rows.dtype.kind in "iu" or n == 0):
            raise ValueError(f"delta {side}_rows must be a 1-D integer array")
        if bias.shape != (n,) or factors.ndim != 2 or len(factors) != n or count.shape != (n,):
            raise ValueError(
                f"delta {side} arrays disagree: {n} rows, {side}_bias {bias.shape}, "
                f"{side}_factors {factors.shape}, {side}_count {count.shape}"
            )
        if n and (rows[0] < 0 or np.any(np.diff(rows) <= 0)):
            raise ValueError(f"delta {side}_rows must be sorted, unique and >= 0")
        if n and (count.dtype.kind not in "iu" or count.min() < 1):
            raise ValueError(f"delta {side}_count must be integers >= 1")
        if bias.dtype.kind not in "fiu" or factors.dtype.kind not in "fiu":
            raise ValueError(f"delta {side}_bias and {side}_factors must be numeric")
        if not (np.isfinite(bias).all() and np.isfinite(factors).all()):
            raise ValueError(f"delta {side} changes hold NaN or inf")
        widths.add(factors.shape[1])
        out[names[0]] = rows.astype(np.int64, copy=False)
        out[names[1]] = bias.astype(np.float64, copy=False)
        out[names[2]] = factors.astype(np.float64, copy=False)
        out[names[3]] = count.astype(np.int64, copy=False)
    if len(widths) != 1:
        raise ValueError(f"delta user and item factors differ in width: {sorted(widths)}")
    return out


def write_delta(store: ObjectStore, key: str, delta: Mapping[str, np.ndarray]) -> str:
    """Store a checked delta under `key`; returns the SHA-256 of the bytes written."""
    data = pack_arrays(check_delta(delta))
    store.put(key, data)
    return sha256_hex(data)


def read_delta(store: ObjectStore, key: str) -> dict[str, np.ndarray]:
    """The delta stored under `key` (ObjectNotFound if none, ArtifactError if malformed)."""
    try:
        return check_delta(load_arrays(store.get(key)))
    except ArtifactError:
        raise
    except ValueError as exc:
        raise ArtifactError(f"delta {key!r} is malformed: {exc}") from exc


def apply_delta(model: BiasedMF, delta: Mapping[str, np.ndarray], weight: float = 1.0) -> BiasedMF:
    """Add ``weight * delta`` to `model`'s rows, in place; returns `model`.

    ``weight=1`` turns the snapshot a delta was made against into the worker's trained
    model on the delta's rows (up to float rounding: ``a + (b - a)`` is `b` within an
    ulp or so); a smaller weight damps a stale update. Rows not in the delta are left
    alone. ValueError if the delta is malformed or does not fit the model (rows beyond
    the model's, another number of factors).
    """
    delta = check_delta(delta)
    w = float(weight)
    if not np.isfinite(w):
        raise ValueError(f"weight must be finite, got {weight!r}")
    for side in _SIDES:
        rows = delta[f"{side}_rows"]
        bias = getattr(model, f"{side}_bias")
        factors = getattr(model, f"{side}_factors")
        if rows.size and rows[-1] >= len(bias):
            raise ValueError(
                f"delta {side}_rows reach row {int(rows[-1])} but the model has {len(bias)} {side}s"
            )
        if delta[f"{side}_factors"].shape[1] != model.factors:
            raise ValueError(
                f"delta has {delta[f'{side}_factors'].shape[1]} factors, the model {model.factors}"
            )
        bias[rows] += w * delta[f"{side}_bias"]
        factors[rows] += w * delta[f"{side}_factors"]
    return model


def average_deltas(deltas: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Average workers' deltas row by row (model averaging).

    The result covers the union of the inputs' rows; each row's change is the mean over
    the deltas that hold the row, weighted by their ``*_count`` (1 for a single worker),
    and its count is the sum of theirs. So a row touched by one worker keeps that
    worker's change, a row touched by two gets the mean of both, and averaging partial
    averages equals averaging all the workers at once.
    """
    if isinstance(deltas, Mapping) or not len(deltas):
        raise ValueError("average_deltas needs a non-empty sequence of deltas")
    checked = [check_delta(d) for d in deltas]
    widths = {d["user_factors"].shape[1] for d in checked}
    if len(widths) != 1:
        raise ValueError(f"deltas have different numbers of factors: {sorted(widths)}")
    (k,) = widths
    out: dict[str, np.ndarray] = {"format_version": np.array(DELTA_FORMAT_VERSION, dtype=np.int64)}
    for side in _SIDES:
        rows = np.concatenate([d[f"{side}_rows"] for d in checked])
        counts = np.concatenate([d[f"{side}_count"] for d in checked])
        bias = np.concatenate([d[f"{side}_bias"] for d in checked])
        factors = np.concatenate([d[f"{side}_factors"] for d in checked]).reshape(-1, k)
        uniq, inv = np.unique(rows, return_inverse=True)
        n = len(uniq)
        weights = counts.astype(np.float64)
        total = np.bincount(inv, weights=weights, minlength=n)
        out[f"{side}_rows"] = uniq
        out[f"{side}_bias"] = np.bincount(inv, weights=bias * weights, minlength=n) / total
        flat = ((inv * k)[:, None] + np.arange(k)).ravel()
        summed = np.bincount(flat, weights=(factors * weights[:, None]).ravel(), minlength=n * k)
        out[f"{side}_factors"] = summed.reshape(n, k) / total[:, None]
        out[f"{side}_count"] = np.bincount(inv, weights=counts, minlength=n).astype(np.int64)
    return out
