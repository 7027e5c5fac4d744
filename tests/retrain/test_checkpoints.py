"""Checkpoints of the distributed coordinator: a crashed job resumes where it stopped.

The fast tests run the workers in this process (``InlineRuntime``), which makes a job
exactly reproducible: a resumed job must then end with the very model an uninterrupted
one does. The slow ones run real worker processes (``LocalRuntime``), once with the
coordinator dropped in this process and once with it killed (SIGKILL) in a process of
its own, while its workers were still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from configurator import EpochConfig, StaticConfigurator
from functions.artifacts import model_from_bytes, sha256_hex
from functions.handler import handler
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore, ObjectStore
from functions.runtimes import ERROR, InvocationRecord, LocalRuntime, Runtime
from functions.shards import delta_key, snapshot_key
from retrain.convergence import ConvergenceRule, StopReason
from retrain.coordinator import (
    CheckpointError,
    DistributedBackend,
    SyncPolicy,
    checkpoint_key,
    read_checkpoint,
    window_key,
)
from retrain.job import EpochRecord, run_training
from retrain.window import RatingsWindow
from tests.support.synthetic import stationary_stream

WORKERS = 3
JOB = "job-1"
REPO = Path(__file__).resolve().parents[2]


def _window() -> RatingsWindow:
    events = stationary_stream(n_users=60, n_items=80, n_events=3_000, seed=4)
    return RatingsWindow(
        [e["user_id"] for e in events],
        [e["item_id"] for e in events],
        np.array([e["rating"] for e in events]),
    )


@pytest.fixture(scope="module")
def window() -> RatingsWindow:
    return _window()


def _model(window: RatingsWindow) -> BiasedMF:
    model = BiasedMF(factors=4, learning_rate=0.05, regularization=0.05, seed=0)
    model.global_mean = float(window.ratings.mean())
    model.grow(window.user_ids, window.item_ids)
    return model


def _config() -> EpochConfig:
    return EpochConfig(batch_size=128, learning_rate=0.05, workers=WORKERS, memory_mb=512)


def _store(root: Path) -> ObjectStore:
    return FileObjectStore(root)


def _arrays_equal(a: BiasedMF, b: BiasedMF) -> bool:
    x, y = a.to_arrays(), b.to_arrays()
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def _checkpointed_model(store: ObjectStore) -> BiasedMF:
    state = read_checkpoint(store, JOB)
    assert state is not None
    return model_from_bytes(store.get(state.model.key), state.model.sha256)


class _Crash(Exception):
    """The coordinator dies (raised from ``on_epoch``, after the epoch's checkpoint)."""


def _crash_after(epochs: int) -> Callable[[EpochRecord], None]:
    def on_epoch(record: EpochRecord) -> None:
        if record.epoch + 1 == epochs:
            raise _Crash

    return on_epoch


class InlineRuntime(Runtime):
    """Runs each worker in this process as it is submitted; deterministic.

    ``hold(labels)`` picks invocations to keep running (stragglers): their futures stay
    pending until :meth:`finish_held` runs them, or for ever.
    """

    name = "inline"

    def __init__(self, hold: Callable[[dict[str, Any]], bool] = lambda labels: False) -> None:
        self.hold = hold
        self.submitted: list[dict[str, Any]] = []
        self.held: list[tuple[dict[str, Any], InvocationRecord, Future[InvocationRecord]]] = []

    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> Future[InvocationRecord]:
        self.submitted.append(payload)
        record = InvocationRecord(uuid.uuid4().hex, memory_mb=memory_mb, labels=dict(labels))
        future: Future[InvocationRecord] = Future()
        if self.hold(labels):
            self.held.append((payload, record, future))
        else:
            self._run(payload, record, future)
        return future

    def finish_held(self) -> None:
        held, self.held = self.held, []
        for payload, record, future in held:
            self._run(payload, record, future)

    def _run(
        self, payload: dict[str, Any], record: InvocationRecord, future: Future[InvocationRecord]
    ) -> None:
        try:
            record.result = handler(payload, None)
        except Exception as exc:
            record.status, record.error = ERROR, f"{type(exc).__name__}: {exc}"
        record.duration_s, record.cost_usd = 0.01, 1e-6
        future.set_result(record)

    def close(self) -> None:
        pass


def _backend(
    runtime: Runtime, store: ObjectStore, policy: SyncPolicy, **kwargs: Any
) -> DistributedBackend:
    return DistributedBackend(runtime, store, store.url, JOB, policy, **kwargs)


def _straggling_worker_2_of_epoch_1(labels: dict[str, Any]) -> bool:
    return labels == {"worker": 2, "epoch": 1}


# -- the checkpoint itself --------------------------------------------------------------


def test_a_job_without_a_checkpoint_does_not_resume(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert read_checkpoint(store, JOB) is None
    assert DistributedBackend.resume(InlineRuntime(), store, store.url, JOB) is None


def test_every_epoch_writes_a_checkpoint_naming_complete_objects(
    window: RatingsWindow, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    backend = _backend(InlineRuntime(), store, SyncPolicy.bsp(), seed=3)
    backend.prepare(_model(window), window)
    for epoch in range(3):
        outcome = backend.run_epoch(_config())
        assert outcome.details["checkpoint"] == checkpoint_key(JOB)
        state = read_checkpoint(store, JOB)
        assert state is not None and state.next_epoch == epoch + 1
        assert [e["epoch"] for e in state.epochs] == list(range(epoch + 1))
        assert state.epochs[-1]["loss"] == outcome.loss
        data = store.get(state.model.key)
        assert sha256_hex(data) == state.model.sha256
        assert _arrays_equal(model_from_bytes(data), backend.model)
    assert state.window.key == window_key(JOB)
    assert state.split == WORKERS and state.seed == 3 and state.in_flight == ()
    assert (state.policy_name, state.policy_ratio) == ("bsp", 1.0)
    assert len(state.stats["used"]) == 3 * WORKERS
    # The snapshot a checkpoint writes is the one the next epoch's workers pull: one
    # snapshot per epoch plus the first, as without checkpoints.
    assert store.list(f"snapshots/{JOB}/") == [snapshot_key(JOB, n) for n in range(4)]


def test_checkpoints_can_be_switched_off(window: RatingsWindow, tmp_path: Path) -> None:
    store = _store(tmp_path)
    backend = _backend(InlineRuntime(), store, SyncPolicy.bsp(), checkpoint=False)
    backend.prepare(_model(window), window)
    assert "checkpoint" not in backend.run_epoch(_config()).details
    assert store.list("checkpoints/") == []


def test_a_checkpoint_round_trips_the_coordinator(window: RatingsWindow, tmp_path: Path) -> None:
    store = _store(tmp_path)
    crashed = InlineRuntime(hold=_straggling_worker_2_of_epoch_1)
    backend = _backend(crashed, store, SyncPolicy.selective(2 / 3), seed=3, timeout_s=60.0)
    backend.prepare(_model(window), window)
    losses = [backend.run_epoch(_config()).loss for _ in range(2)]

    state = read_checkpoint(store, JOB)
    assert state is not None
    [in_flight] = state.in_flight
    assert (in_flight.worker, in_flight.epoch, in_flight.attempt, in_flight.memory_mb) == (
        2,
        1,
        0,
        512,
    )
    assert in_flight.task.delta_key == delta_key(JOB, 1, 2)
    assert in_flight.task.snapshot_key == snapshot_key(JOB, 1)

    runtime = InlineRuntime()
    resumed = DistributedBackend.resume(runtime, store, store.url, JOB)
    assert resumed is not None
    assert resumed.epoch == 2 and resumed.seed == 3 and resumed.timeout_s == 60.0
    assert resumed.policy == SyncPolicy.selective(2 / 3)
    assert _arrays_equal(resumed.model, backend.model)
    assert resumed.epochs == backend.epochs and [e.loss for e in resumed.epochs] == losses
    assert resumed.stats == backend.stats
    # The straggler's delta is not in the store: it is relaunched, the same task as before.
    assert runtime.submitted == [crashed.held[0][0]]
    assert store.exists(delta_key(JOB, 1, 2))
    resumed.run_epoch(_config())
    late = [u for u in resumed.stats.used if u.computed_on == 1 and u.worker == 2]
    assert [(u.applied_in, u.staleness) for u in late] == [(2, 1)]
    assert resumed.epochs[-1].epoch == 2


def test_a_delta_that_landed_after_the_crash_is_applied_as_a_stale_update(
    window: RatingsWindow, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    crashed = InlineRuntime(hold=_straggling_worker_2_of_epoch_1)
    backend = _backend(crashed, store, SyncPolicy.selective(2 / 3))
    backend.prepare(_model(window), window)
    for _ in range(2):
        backend.run_epoch(_config())
    crashed.finish_held()  # the straggler outlives its coordinator and writes its delta
    assert store.exists(delta_key(JOB, 1, 2))
    at_crash = backend.model.copy()

    runtime = InlineRuntime()
    resumed = DistributedBackend.resume(runtime, store, store.url, JOB)
    assert resumed is not None and runtime.submitted == []  # nothing to relaunch
    assert _arrays_equal(resumed.model, at_crash)
    resumed.run_epoch(_config())
    late = [u for u in resumed.stats.used if u.computed_on == 1 and u.worker == 2]
    assert [(u.applied_in, u.staleness) for u in late] == [(2, 1)]
    # As if the coordinator had not crashed: every shard starts on the new snapshot.
    assert sorted(p["worker"] for p in runtime.submitted) == [0, 1, 2]
    assert {p["snapshot_key"] for p in runtime.submitted} == {snapshot_key(JOB, 2)}
    assert not any(r.labels.get("recovered") for r in resumed.stats.invocations)


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("not json", "latest.json"),
        ("wrong version", "latest.json"),
        ("other job", "latest.json"),
        ("missing field", "latest.json"),
        ("damaged snapshot", "snapshots/job-1/"),
        ("missing snapshot", "snapshots/job-1/"),
        ("damaged window", "window.npz"),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_key(
    window: RatingsWindow, tmp_path: Path, damage: str, named: str
) -> None:
    store = _store(tmp_path)
    backend = _backend(InlineRuntime(), store, SyncPolicy.bsp())
    backend.prepare(_model(window), window)
    backend.run_epoch(_config())
    key = checkpoint_key(JOB)
    state = json.loads(store.get(key))
    if damage == "not json":
        store.put(key, store.get(key)[:-10])
    elif damage == "wrong version":
        store.put(key, json.dumps({**state, "format_version": 99}).encode())
    elif damage == "other job":
        store.put(key, json.dumps({**state, "job_id": "job-2"}).encode())
    elif damage == "missing field":
        del state["epochs"]
        store.put(key, json.dumps(state).encode())
    elif damage == "damaged snapshot":
        data = bytearray(store.get(state["model"]["key"]))
        data[len(data) // 2] ^= 0xFF
        store.put(state["model"]["key"], bytes(data))
    elif damage == "missing snapshot":
        store.delete(state["model"]["key"])
    elif damage == "damaged window":
        store.put(state["window"]["key"], b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match=named):
        DistributedBackend.resume(InlineRuntime(), store, store.url, JOB)


# -- a job that resumes -----------------------------------------------------------------


def _run_job(
    backend: DistributedBackend,
    window: RatingsWindow,
    epochs: int,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    resumed: bool = False,
) -> Any:
    return run_training(
        None if resumed else _model(window),
        window,
        backend,
        StaticConfigurator(_config()),
        ConvergenceRule(max_epochs=epochs),
        on_epoch,
        history=backend.epochs if resumed else (),
        prepare=not resumed,
    )


@pytest.mark.parametrize("policy", [SyncPolicy.bsp(), SyncPolicy.asp()], ids=lambda p: p.name)
def test_a_resumed_job_ends_with_the_model_of_an_uninterrupted_one(
    window: RatingsWindow, tmp_path: Path, policy: SyncPolicy
) -> None:
    reference = _run_job(_backend(InlineRuntime(), _store(tmp_path / "a"), policy), window, 5)

    store = _store(tmp_path / "b")
    with pytest.raises(_Crash):
        _run_job(_backend(InlineRuntime(), store, policy), window, 5, _crash_after(3))
    resumed = DistributedBackend.resume(InlineRuntime(), store, store.url, JOB)
    assert resumed is not None and resumed.epoch == 3
    reported: list[int] = []
    result = _run_job(resumed, window, 5, lambda r: reported.append(r.epoch), resumed=True)

    assert reported == [3, 4]
    assert [e.epoch for e in result.epochs] == [0, 1, 2, 3, 4]
    assert result.stop_reason is StopReason.MAX_EPOCHS
    assert [e.loss for e in result.epochs] == [e.loss for e in reference.epochs]
    assert _arrays_equal(result.model, reference.model)
    assert result.holdout_rmse == reference.holdout_rmse
    # Invocations that finished while no coordinator ran were billed to the crashed one,
    # which kept no record of them (ASP always has λ in flight; BSP none).
    unbilled = 0 if policy.name == "bsp" else WORKERS * 1e-6
    assert result.cost_usd == pytest.approx(reference.cost_usd - unbilled)


def test_a_job_that_had_already_finished_runs_no_more_epochs(
    window: RatingsWindow, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    with pytest.raises(_Crash):
        _run_job(_backend(InlineRuntime(), store, SyncPolicy.bsp()), window, 3, _crash_after(3))
    runtime = InlineRuntime()
    resumed = DistributedBackend.resume(runtime, store, store.url, JOB)
    assert resumed is not None
    result = _run_job(resumed, window, 3, resumed=True)
    assert runtime.submitted == [] and len(result.epochs) == 3
    assert result.stop_reason is StopReason.MAX_EPOCHS


def test_history_must_be_numbered_from_zero(window: RatingsWindow, tmp_path: Path) -> None:
    backend = _backend(InlineRuntime(), _store(tmp_path), SyncPolicy.bsp())
    history = [EpochRecord(1, 1.0, 0.1, _config().as_dict())]
    with pytest.raises(ValueError, match="history"):
        run_training(
            _model(window),
            window,
            backend,
            StaticConfigurator(_config()),
            ConvergenceRule(max_epochs=3),
            history=history,
        )


# -- real worker processes --------------------------------------------------------------


def _stragglers(factor: float = 6.0) -> Callable[[], float]:
    """Every fourth invocation runs ``factor`` times slower."""
    count = iter(range(1_000_000))
    return lambda: factor if next(count) % 4 == 3 else 1.0


def _assert_resumed_like_an_uninterrupted_job(
    result: Any, reference: Any, at_resume: float, first_new: int
) -> None:
    epochs = [e.epoch for e in result.epochs]
    assert epochs == list(range(len(reference.epochs)))
    assert result.epochs[-1].loss < at_resume  # training went on, and well
    assert result.epochs[-1].loss < result.epochs[0].loss
    new = [e.loss for e in result.epochs[first_new:]]
    assert all(b < a * 1.02 for a, b in zip([at_resume, *new[:-1]], new, strict=True))
    final, expected = result.epochs[-1].loss, reference.epochs[-1].loss
    assert final == pytest.approx(expected, rel=0.05)
    assert result.holdout_rmse == pytest.approx(reference.holdout_rmse, rel=0.05)


def check_a_dropped_coordinator_resumes(
    make_runtime: Callable[..., Any], window: RatingsWindow, tmp_path: Path
) -> None:
    """A job on ``make_runtime``'s workers, its coordinator dropped after three of six
    epochs with stragglers in flight, resumes from its checkpoint and ends like the
    same job run without a break."""
    policy = SyncPolicy.selective(2 / 3)
    reference = _run_job(
        _backend(make_runtime(slowdown=_stragglers()), _store(tmp_path / "reference"), policy),
        window,
        6,
    )
    store = _store(tmp_path / "job")
    crashed = _backend(make_runtime(slowdown=_stragglers()), store, policy)
    with pytest.raises(_Crash):
        _run_job(crashed, window, 6, _crash_after(3))
    del crashed  # never asked for its result: stragglers may still be running

    resumed = DistributedBackend.resume(make_runtime(), store, store.url, JOB)
    assert resumed is not None and resumed.epoch == 3
    assert _arrays_equal(resumed.model, _checkpointed_model(store))
    at_resume = resumed.epochs[-1].loss
    result = _run_job(resumed, window, 6, resumed=True)
    _assert_resumed_like_an_uninterrupted_job(result, reference, at_resume, first_new=3)


@pytest.mark.slow
def test_a_coordinator_dropped_mid_job_resumes_on_real_workers(
    window: RatingsWindow, tmp_path: Path, make_local_runtime: Callable[..., LocalRuntime]
) -> None:
    check_a_dropped_coordinator_resumes(make_local_runtime, window, tmp_path)


def _coordinator_main(root: str) -> None:
    """A coordinator in a process of its own, for the test below to kill."""
    window = _window()
    store = _store(Path(root))
    # Stragglers that outlive the kill; a pause after each epoch, as a job record written
    # to a database would make, lets the test catch the checkpoint it waits for.
    with LocalRuntime(concurrency=WORKERS, slowdown=_stragglers(100.0)) as runtime:
        backend = _backend(runtime, store, SyncPolicy.selective(2 / 3))
        _run_job(backend, window, 1_000, on_epoch=lambda record: time.sleep(0.2))


@pytest.mark.slow
def test_a_coordinator_killed_mid_job_resumes_from_its_checkpoint(
    window: RatingsWindow, tmp_path: Path, make_local_runtime: Callable[..., LocalRuntime]
) -> None:
    make_runtime = make_local_runtime
    epochs = 8
    policy = SyncPolicy.selective(2 / 3)
    reference = _run_job(
        _backend(make_runtime(slowdown=_stragglers()), _store(tmp_path / "ref"), policy),
        window,
        epochs,
    )

    root = tmp_path / "job"
    store = _store(root)
    log_path = tmp_path / "coordinator.log"
    code = (
        "import sys\n"
        "from tests.retrain.test_checkpoints import _coordinator_main\n"
        "_coordinator_main(sys.argv[1])\n"
    )
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(root)],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers too, so that all of them can be cleaned up
        )
    try:
        # Kill it after its second checkpoint, once one says a straggler is running.
        deadline = time.monotonic() + 120
        while True:
            state = read_checkpoint(store, JOB) if store.exists(checkpoint_key(JOB)) else None
            if state is not None and state.next_epoch >= 2 and state.in_flight:
                break
            assert child.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "no checkpoint with work in flight in time"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL

        state = read_checkpoint(store, JOB)
        assert state is not None and 2 <= state.next_epoch < epochs and state.in_flight
        # The killed coordinator's stragglers finish on their own and push their updates.
        late = [entry.task.delta_key for entry in state.in_flight]
        while not all(store.exists(key) for key in late):
            assert time.monotonic() < deadline + 60, f"the stragglers' deltas {late} never came"
            time.sleep(0.05)

        resumed = DistributedBackend.resume(make_runtime(), store, store.url, JOB)
        assert resumed is not None and resumed.epoch == state.next_epoch
        assert _arrays_equal(resumed.model, _checkpointed_model(store))
        at_resume = resumed.epochs[-1].loss
        result = _run_job(resumed, window, epochs, resumed=True)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)  # the killed coordinator's orphaned workers
    # Their updates were used, late, by the resumed coordinator.
    used = {(u.worker, u.computed_on): u for u in resumed.stats.used}
    for entry in state.in_flight:
        update = used[entry.worker, entry.epoch]
        assert update.applied_in == state.next_epoch and update.staleness >= 1
    _assert_resumed_like_an_uninterrupted_job(
        result, reference, at_resume, first_new=state.next_epoch
    )
