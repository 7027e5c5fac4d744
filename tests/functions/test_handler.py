"""The retraining worker on a file object store: training, deltas, averaging, limits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from functions.artifacts import ArtifactError, model_from_bytes, model_to_bytes, sha256_hex
from functions.handler import (
    EventError,
    TrainingDiverged,
    WorkerTask,
    handler,
    parse_event,
    run_worker,
)
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore, ObjectNotFound
from functions.shards import (
    apply_delta,
    average_deltas,
    check_delta,
    delta_key,
    read_delta,
    read_shard,
    shard_key,
    snapshot_key,
    write_delta,
    write_shard,
)
from tests.support.synthetic import stationary_stream

JOB = "job-1"
SIDES = ("user", "item")


@dataclass
class Problem:
    store: FileObjectStore
    snapshot: bytes
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    def model(self) -> BiasedMF:
        return model_from_bytes(self.snapshot)

    def shard(self, worker: int, workers: int, mask: np.ndarray) -> str:
        key = shard_key(JOB, worker, workers)
        write_shard(self.store, key, self.users[mask], self.items[mask], self.ratings[mask])
        return key

    def event(self, shard: str, worker: int = 0, **overrides: Any) -> dict[str, Any]:
        event = {
            "store_url": self.store.url,
            "job_id": JOB,
            "epoch": 0,
            "worker": worker,
            "snapshot_key": snapshot_key(JOB, 0),
            "shard_key": shard,
            "delta_key": delta_key(JOB, 0, worker),
            "batch_size": 128,
            "learning_rate": 0.05,
            "regularization": 0.02,
            "local_epochs": 2,
            "seed": 7,
        }
        event.update(overrides)
        return event


@pytest.fixture
def problem(tmp_path: Path) -> Problem:
    """A low-rank rating problem and a briefly trained snapshot of it in a file store."""
    events = stationary_stream(n_users=60, n_items=80, n_events=3_000, factors=3, seed=11)
    user_ids = [e["user_id"] for e in events]
    item_ids = [e["item_id"] for e in events]
    ratings = np.array([e["rating"] for e in events])
    model = BiasedMF(factors=4, seed=0)
    model.fit(user_ids, item_ids, ratings, epochs=1, batch_size=256)
    store = FileObjectStore(tmp_path / "store")
    snapshot = model_to_bytes(model)
    store.put(snapshot_key(JOB, 0), snapshot)
    users, items = model.encode_users(user_ids), model.encode_items(item_ids)
    return Problem(store, snapshot, users, items, ratings)


class Context:
    """The part of Lambda's context the worker reads."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def test_worker_lowers_its_shard_loss_and_returns_json(problem: Problem) -> None:
    shard = problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool))
    result = handler(problem.event(shard), None)

    assert json.loads(json.dumps(result, allow_nan=False)) == result
    assert {
        "job_id",
        "epoch",
        "worker",
        "delta_key",
        "samples",
        "loss_before",
        "loss_after",
    } <= set(result)
    assert (result["job_id"], result["epoch"], result["worker"]) == (JOB, 0, 0)
    assert result["samples"] == len(problem.ratings)
    assert result["samples_trained"] == 2 * len(problem.ratings)
    assert result["epochs_completed"] == 2 and result["stopped_early"] is False
    assert result["loss_after"] < result["loss_before"]
    assert result["duration_s"] > 0 and result["peak_memory_mb"] > 10
    assert result["snapshot_sha256"] == sha256_hex(problem.snapshot)
    stored = problem.store.get(result["delta_key"])
    assert sha256_hex(stored) == result["delta_sha256"]

    # Seeded: the same event writes the same delta, byte for byte.
    assert handler(problem.event(shard), None)["delta_sha256"] == result["delta_sha256"]
    # The snapshot's checksum can be enforced.
    verified = problem.event(shard, snapshot_sha256=result["snapshot_sha256"])
    assert handler(verified, None)["delta_sha256"] == result["delta_sha256"]
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        handler(problem.event(shard, snapshot_sha256="0" * 64), None)


def test_delta_covers_the_touched_rows_and_rebuilds_the_trained_model(problem: Problem) -> None:
    mask = problem.users < 25  # a third of the users, so most user rows stay untouched
    shard = problem.shard(0, 1, mask)
    result, trained = run_worker(parse_event(problem.event(shard)))
    delta = read_delta(problem.store, result["delta_key"])
    snapshot = problem.model()

    np.testing.assert_array_equal(delta["user_rows"], np.unique(problem.users[mask]))
    np.testing.assert_array_equal(delta["item_rows"], np.unique(problem.items[mask]))
    assert result["users_touched"] == len(delta["user_rows"]) == 25
    assert np.all(delta["user_count"] == 1) and np.all(delta["item_count"] == 1)

    rebuilt = apply_delta(problem.model(), delta)
    for side in SIDES:
        rows = delta[f"{side}_rows"]
        untouched = np.setdiff1d(np.arange(len(getattr(snapshot, f"{side}_bias"))), rows)
        for part in ("bias", "factors"):
            name = f"{side}_{part}"
            before, after = getattr(snapshot, name), getattr(trained, name)
            # Rows outside the shard are exactly the snapshot's, and the delta leaves them be.
            np.testing.assert_array_equal(after[untouched], before[untouched])
            np.testing.assert_array_equal(getattr(rebuilt, name)[untouched], before[untouched])
            # On its rows the delta turns the snapshot into the trained model (a + (b - a)
            # is b up to one rounding).
            assert np.any(after[rows] != before[rows])
            np.testing.assert_allclose(
                getattr(rebuilt, name)[rows], after[rows], rtol=0, atol=1e-12
            )
    u, i, r = read_shard(problem.store, shard)
    assert rebuilt.mse_encoded(u, i, r) == pytest.approx(result["loss_after"], rel=1e-9)
    assert result["loss_after"] < result["loss_before"]

    # A half-weight delta moves the rows half-way.
    half = apply_delta(problem.model(), delta, weight=0.5)
    np.testing.assert_allclose(
        half.user_bias - snapshot.user_bias,
        (rebuilt.user_bias - snapshot.user_bias) / 2,
        atol=1e-12,
    )


def test_averaged_deltas_apply_per_row_means(problem: Problem) -> None:
    # Users 0-19 only in shard 0, 40+ only in shard 1, 20-39 split between both.
    split = np.arange(len(problem.ratings)) % 2 == 0
    first = (problem.users < 20) | ((problem.users < 40) & split)
    keys = [problem.shard(0, 2, first), problem.shard(1, 2, ~first)]
    results = [handler(problem.event(keys[w], worker=w), None) for w in (0, 1)]
    deltas = [read_delta(problem.store, r["delta_key"]) for r in results]
    averaged = average_deltas(deltas)

    for side in SIDES:
        rows = [d[f"{side}_rows"] for d in deltas]
        np.testing.assert_array_equal(averaged[f"{side}_rows"], np.union1d(*rows))
        index = {int(row): n for n, row in enumerate(averaged[f"{side}_rows"])}
        in_both = np.intersect1d(*rows)
        for part in ("bias", "factors"):
            name = f"{side}_{part}"
            for w, d in enumerate(deltas):
                only = np.setdiff1d(rows[w], rows[1 - w])
                at_avg = [index[int(x)] for x in only]
                at_own = np.searchsorted(rows[w], only)
                np.testing.assert_array_equal(averaged[name][at_avg], d[name][at_own])
            at_avg = [index[int(x)] for x in in_both]
            mean = (
                deltas[0][name][np.searchsorted(rows[0], in_both)]
                + deltas[1][name][np.searchsorted(rows[1], in_both)]
            ) / 2
            np.testing.assert_allclose(averaged[name][at_avg], mean, rtol=1e-15, atol=0)
        counts = averaged[f"{side}_count"]
        assert set(counts.tolist()) <= {1, 2}
        assert int((counts == 2).sum()) == len(in_both)
    assert len(np.intersect1d(deltas[0]["user_rows"], deltas[1]["user_rows"])) == 20
    assert int((averaged["user_count"] == 1).sum()) == 40

    # Averaging partial averages weights by count: the same as averaging all at once.
    nested = average_deltas([averaged, deltas[0]])
    flat = average_deltas([deltas[0], deltas[1], deltas[0]])
    for name in flat:
        np.testing.assert_allclose(nested[name], flat[name], rtol=1e-12, atol=1e-15)

    # The averaged update (φ_{t+1}) fits the whole window better than the snapshot.
    model = problem.model()
    before = model.mse_encoded(problem.users, problem.items, problem.ratings)
    apply_delta(model, averaged)
    assert model.mse_encoded(problem.users, problem.items, problem.ratings) < before
    # Deltas round-trip through the store.
    write_delta(problem.store, "deltas/job-1/avg.npz", averaged)
    restored = read_delta(problem.store, "deltas/job-1/avg.npz")
    assert all(np.array_equal(restored[k], averaged[k]) for k in averaged)


def test_worker_stops_early_when_the_invocation_runs_out_of_time(problem: Problem) -> None:
    shard = problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool))
    event = problem.event(shard, batch_size=100, local_epochs=3)
    result, trained = run_worker(parse_event(event), context=Context(remaining_ms=5_000))

    assert result["stopped_early"] is True
    assert result["samples_trained"] == 100 and result["epochs_completed"] == 0
    assert json.loads(json.dumps(result, allow_nan=False)) == result
    delta = read_delta(problem.store, result["delta_key"])
    # Only the rows of the one minibatch that ran are in the delta, and they rebuild it.
    assert 0 < len(delta["user_rows"]) <= 100 and 0 < len(delta["item_rows"]) <= 100
    assert len(delta["user_rows"]) < len(np.unique(problem.users))
    rebuilt = apply_delta(problem.model(), delta)
    np.testing.assert_allclose(rebuilt.user_factors, trained.user_factors, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rebuilt.item_bias, trained.item_bias, rtol=0, atol=1e-12)

    # With time to spare, or a margin of zero, it runs to the end.
    for context, margin in ((Context(remaining_ms=900_000), 20.0), (Context(5_000), 0.0)):
        done = handler(dict(event, time_margin_s=margin), context)
        assert done["stopped_early"] is False and done["epochs_completed"] == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("store_url", ""),
        ("job_id", 3),
        ("epoch", -1),
        ("worker", True),
        ("worker", 1.0),
        ("snapshot_key", "/abs/model.npz"),
        ("shard_key", "shards/../x.npz"),
        ("delta_key", ""),
        ("batch_size", 0),
        ("learning_rate", 0),
        ("learning_rate", "0.1"),
        ("regularization", float("nan")),
        ("local_epochs", 0),
        ("seed", -1),
        ("snapshot_sha256", "abc"),
        ("time_margin_s", -1),
    ],
)
def test_bad_event_fields_are_named(problem: Problem, field: str, value: object) -> None:
    event = problem.event(shard_key(JOB, 0, 1))
    event[field] = value
    with pytest.raises(EventError, match=field) as error:
        handler(event, None)
    assert error.value.field == field


def test_event_shape_errors(problem: Problem) -> None:
    event = problem.event(shard_key(JOB, 0, 1))
    for field in ("shard_key", "learning_rate"):
        with pytest.raises(EventError, match=f"'{field}': is required") as error:
            parse_event({k: v for k, v in event.items() if k != field})
        assert error.value.field == field
    with pytest.raises(EventError, match="learning_rte") as error:
        parse_event(dict(event, learning_rte=0.1))
    assert error.value.field == "learning_rte"
    with pytest.raises(EventError, match="must be a JSON object"):
        handler([event], None)
    with pytest.raises(EventError, match="delta_key"):
        parse_event(dict(event, delta_key=event["snapshot_key"]))
    # A task round-trips through its event; defaults are filled in.
    task = parse_event(event)
    assert isinstance(task, WorkerTask) and parse_event(task.as_event()) == task
    assert task.snapshot_sha256 is None and task.time_margin_s == 20.0
    del event["local_epochs"], event["seed"]
    assert (parse_event(event).local_epochs, parse_event(event).seed) == (1, 0)


def test_missing_or_mismatched_objects(problem: Problem) -> None:
    with pytest.raises(ObjectNotFound, match="shards/job-1/00000-of-00001.npz"):
        handler(problem.event(shard_key(JOB, 0, 1)), None)
    key = "shards/job-1/too-far.npz"
    write_shard(problem.store, key, [0, 10_000], [0, 1], [3.0, 4.0])
    with pytest.raises(EventError, match="users reach row 10000") as error:
        handler(problem.event(key), None)
    assert error.value.field == "shard_key"
    write_shard(problem.store, "shards/job-1/empty.npz", [], [], [])
    with pytest.raises(EventError, match="no ratings"):
        handler(problem.event("shards/job-1/empty.npz"), None)
    problem.store.put("shards/job-1/junk.npz", b"not a shard")
    with pytest.raises(ArtifactError):
        handler(problem.event("shards/job-1/junk.npz"), None)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # overflow on the way to NaN
def test_a_diverging_worker_writes_no_delta(problem: Problem) -> None:
    shard = problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool))
    event = problem.event(shard, learning_rate=1e6, local_epochs=3)
    with pytest.raises(TrainingDiverged, match="learning_rate=1000000.0"):
        handler(event, None)
    assert not problem.store.exists(event["delta_key"])


def test_shard_and_delta_checks(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    sha = write_shard(store, "s.npz", np.array([0, 2]), [1, 1], [4.0, 3.5])
    assert sha == sha256_hex(store.get("s.npz"))
    shard = read_shard(store, "s.npz")
    assert len(shard) == 2 and shard.users.dtype == np.int64 and shard.ratings.dtype == np.float64
    with pytest.raises(ValueError, match="same length"):
        write_shard(store, "s.npz", [0], [0, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match=">= 0"):
        write_shard(store, "s.npz", [-1], [0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        write_shard(store, "s.npz", [0], [0], [np.nan])

    model = BiasedMF(factors=2, seed=0)
    model.fit(["a", "b"], ["x", "y"], [4.0, 2.0], epochs=1)
    delta = {
        "format_version": np.array(1),
        "user_rows": np.array([1]),
        "user_bias": np.array([0.5]),
        "user_factors": np.array([[0.1, -0.1]]),
        "user_count": np.array([1]),
        "item_rows": np.array([], dtype=np.int64),
        "item_bias": np.zeros(0),
        "item_factors": np.zeros((0, 2)),
        "item_count": np.zeros(0, dtype=np.int64),
    }
    before = model.user_bias.copy()
    apply_delta(model, delta, weight=2.0)
    np.testing.assert_allclose(model.user_bias - before, [0.0, 1.0])
    with pytest.raises(ValueError, match="model has 2 users"):
        apply_delta(model, dict(delta, user_rows=np.array([2])))
    with pytest.raises(ValueError, match="NaN"):
        check_delta(dict(delta, user_bias=np.array([np.nan])))
    twice = {"user_rows": [1, 1], "user_bias": np.zeros(2), "user_factors": np.zeros((2, 2))}
    with pytest.raises(ValueError, match="sorted, unique"):
        check_delta(dict(delta, **twice, user_count=np.ones(2, dtype=np.int64)))
    with pytest.raises(ValueError, match="format_version"):
        check_delta(dict(delta, format_version=np.array(99)))
    with pytest.raises(ValueError, match="non-empty"):
        average_deltas([])


def test_key_layout() -> None:
    assert snapshot_key("j", 3) == "snapshots/j/000003.pack"
    assert shard_key("j", 2, 8) == "shards/j/00002-of-00008.npz"
    assert delta_key("j", 3, 2) == "deltas/j/000003/00002.pack"
    for bad in (lambda: snapshot_key("a/b", 0), lambda: delta_key("j", -1, 0)):
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(ValueError, match="worker"):
        shard_key("j", 8, 8)
