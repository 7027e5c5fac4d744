"""The ``sim`` runtime: Lambda workers as a discrete-event simulation in virtual time.

Nothing runs. Each invocation's duration comes from a :class:`PerformanceModel`, fitted
on measured runs with :func:`calibrate`, so a thousand workers and their stragglers, cold
starts, time limits and bill take a fraction of a second instead of the real minutes.
The configurator and the cost benchmarks use it to try configurations nobody paid for.

Model of one invocation (see ``docs/simulator.md`` for the fit and its measured error)::

    duration = [cold] cold_start_s
             + slowdown * ( overhead_s
                          + requests * request_latency_s + bytes / bandwidth_bytes_per_s
                          + (samples * compute_s_per_sample
                             + batches * compute_s_per_batch) / cpu_share(memory_mb) )

    cpu_share(memory_mb) = min(memory_mb / mb_per_vcpu, max_vcpus, worker_vcpus)

* Lambda gives one vCPU per 1,769 MB (``mb_per_vcpu`` from ``functions/prices.json``),
  at most 6. The numpy worker is effectively single-threaded (``worker_vcpus=1``): below
  1,769 MB its compute slows in proportion to the CPU share, above it gains nothing.
  The fixed overhead and the object-store I/O are not scaled.
* ``slowdown`` is drawn per invocation from the runtime's seeded generator: a straggler
  (probability ``straggler_p``) runs ``uniform(*straggler_slowdown)`` times slower, and
  every invocation carries a mean-one log-normal jitter of ``jitter_sigma``.
* A container's first invocation is a cold start; containers are per memory size and
  stay warm ``keep_warm_s`` after their last invocation, as in the local runtime.
* At most ``concurrency`` invocations run at once; the rest queue (``queued_s``) unbilled.
* An invocation that would overrun its time limit stops early, as the worker does
  (:mod:`functions.handler`, ``time_margin_s``): it ends ``time_margin_s`` before the
  limit with status ``ok`` and ``labels["stopped_early"]`` true. Only when even its fixed
  part passes the limit, or with ``stop_early=False`` (what the local runtime's injected
  stragglers do: they sleep after the handler returned), is its status ``timeout``.
* Billing is Lambda's, from :mod:`functions.pricing`: GB-seconds per started millisecond
  of the virtual duration plus the request price.

Virtual time
------------
:meth:`SimRuntime.submit` starts (or queues) an invocation at the runtime's virtual
``clock.now`` and returns a :class:`SimFuture`. Futures complete in virtual-time order
when the simulation advances, which it does when somebody waits: ``future.result()``,
``concurrent.futures.wait`` (any ``return_when``) and ``as_completed`` all advance it, one
completion at a time, until what they wait for is done. So a caller written for a real
runtime, such as the coordinator, runs on it unchanged. Real-time ``timeout`` arguments
have no meaning here: a wait advances virtual time to the next completion at once.
:meth:`SimRuntime.step`, :meth:`SimRuntime.advance_to` and :meth:`SimRuntime.run` drive
the simulation explicitly.

The worker's result is not computed: records carry ``result=None``. The work of an
invocation comes from ``samples_of(payload)``; by default (:class:`StoreWork`) the
shard named by the worker event is read from the object store for its sample count. A
``samples=`` label overrides that. With ``write_deltas=True`` each successful invocation
writes an empty delta (no rows) under the event's ``delta_key``, so that a coordinator
that reads deltas runs end to end, its model unchanged: timing and cost only.

:func:`simulate_epochs` replays the coordinator's κ-of-λ epochs (BSP, selective, ASP)
directly, without a store or a model, for configuration searches.

>>> model = PerformanceModel(compute_s_per_sample=1e-5, overhead_s=0.1, cold_start_s=0.5)
>>> with SimRuntime(model) as sim:
...     first = sim.submit({}, memory_mb=1769, timeout_s=60, samples=100_000).result()
...     second = sim.submit({}, memory_mb=1769, timeout_s=60, samples=100_000).result()
>>> round(first.duration_s, 3), first.cold_start, round(second.duration_s, 3), sim.clock.now
(1.6, True, 1.1, 2.7)
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from functions.artifacts import load_arrays
from functions.objectstore import ObjectStore, open_object_store
from functions.pricing import LambdaPrices, lambda_prices
from functions.runtimes.base import ERROR, OK, TIMEOUT, InvocationRecord, Runtime, register_runtime
from functions.shards import DELTA_FORMAT_VERSION, write_delta

__all__ = [
    "DEFAULT_MODEL",
    "CalibrationFit",
    "EpochTiming",
    "PerformanceModel",
    "SimFuture",
    "SimRuntime",
    "Simulation",
    "StoreWork",
    "UncostablePayload",
    "VirtualClock",
    "Work",
    "calibrate",
    "fit_performance_model",
    "simulate_epochs",
]

#: Object-store requests of one worker invocation: get snapshot, get shard, put delta.
WORKER_REQUESTS = 3
#: The worker's default ``time_margin_s`` (:class:`functions.handler.WorkerTask`).
DEFAULT_TIME_MARGIN_S = 20.0


def _mb_per_vcpu() -> float:
    return float(lambda_prices().mb_per_vcpu)


def _check(name: str, value: float, *, positive: bool = False, allow_inf: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and not math.isnan(value) and (allow_inf or math.isfinite(value))
    if not ok or not (value > 0 if positive else value >= 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(
            f"{name} must be a {'' if allow_inf else 'finite '}number {bound}, got {value!r}"
        )


# -- the performance model ---------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """What one invocation has to do.

    Parameters
    ----------
    samples
        SGD sample updates: the shard's samples times ``local_epochs``.
    batches
        Minibatches those updates come in (each has a fixed cost in the numpy worker).
    bytes_read, bytes_written
        Object-store traffic: snapshot plus shard in, the delta out.
    requests
        Object-store requests (three for the worker).
    """

    samples: int
    batches: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    requests: int = WORKER_REQUESTS

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"Work.{f.name} must be an integer >= 0, got {value!r}")

    @classmethod
    def for_shard(
        cls,
        samples: int,
        batch_size: int | None = None,
        local_epochs: int = 1,
        bytes_read: int = 0,
        bytes_written: int = 0,
    ) -> Work:
        """The work of a worker on a shard of ``samples`` ratings."""
        batches = math.ceil(samples / batch_size) * local_epochs if batch_size else 0
        return cls(int(samples) * local_epochs, batches, bytes_read, bytes_written)


@dataclass(frozen=True)
class PerformanceModel:
    """Seconds one worker invocation takes on Lambda; see the module docstring.

    Parameters
    ----------
    compute_s_per_sample
        Seconds per SGD sample update at one full vCPU.
    compute_s_per_batch
        Seconds per minibatch at one full vCPU (numpy's per-call cost).
    overhead_s
        Fixed seconds per invocation: dispatch, loading the snapshot, the loss passes'
        fixed part, writing the result; not scaled by CPU share.
    cold_start_s
        Extra seconds of a container's first invocation, counted in its duration.
    request_latency_s, bandwidth_bytes_per_s
        The object store: seconds per request, and bytes per second moved.
    jitter_sigma
        Sigma of the mean-one log-normal factor every invocation's time carries.
    straggler_p, straggler_slowdown
        Probability that an invocation is a straggler, and the range (low, high) its
        slowdown factor is drawn from uniformly.
    worker_vcpus
        vCPUs the worker can use (1: the numpy worker is single-threaded).
    mb_per_vcpu, max_vcpus
        Lambda's CPU share: one vCPU per ``mb_per_vcpu`` MB (from the price file), at
        most ``max_vcpus``.
    """

    compute_s_per_sample: float
    compute_s_per_batch: float = 0.0
    overhead_s: float = 0.0
    cold_start_s: float = 0.0
    request_latency_s: float = 0.0
    bandwidth_bytes_per_s: float = math.inf
    jitter_sigma: float = 0.0
    straggler_p: float = 0.0
    straggler_slowdown: tuple[float, float] = (1.0, 1.0)
    worker_vcpus: float = 1.0
    mb_per_vcpu: float = field(default_factory=_mb_per_vcpu)
    max_vcpus: float = 6.0

    def __post_init__(self) -> None:
        for name in (
            "compute_s_per_sample",
            "compute_s_per_batch",
            "overhead_s",
            "cold_start_s",
            "request_latency_s",
            "jitter_sigma",
        ):
            _check(name, getattr(self, name))
        _check("bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, positive=True, allow_inf=True)
        for name in ("worker_vcpus", "mb_per_vcpu", "max_vcpus"):
            _check(name, getattr(self, name), positive=True)
        _check("straggler_p", self.straggler_p)
        if self.straggler_p > 1:
            raise ValueError(f"straggler_p must be within [0, 1], got {self.straggler_p}")
        try:
            low, high = (float(x) for x in self.straggler_slowdown)
        except (TypeError, ValueError):
            raise ValueError(
                f"straggler_slowdown must be a pair (low, high), got {self.straggler_slowdown!r}"
            ) from None
        if not (math.isfinite(high) and 1.0 <= low <= high):
            raise ValueError(
                f"straggler_slowdown must satisfy 1 <= low <= high, got {self.straggler_slowdown}"
            )
        object.__setattr__(self, "straggler_slowdown", (low, high))

    def replace(self, **changes: Any) -> PerformanceModel:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (``bandwidth_bytes_per_s`` may be ``inf``)."""
        values = asdict(self)
        values["straggler_slowdown"] = list(self.straggler_slowdown)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PerformanceModel:
        values = dict(values)
        if "straggler_slowdown" in values:
            values["straggler_slowdown"] = tuple(values["straggler_slowdown"])
        return cls(**values)

    # -- predictions -------------------------------------------------------------------
    def vcpus(self, memory_mb: float) -> float:
        """Lambda's vCPUs at a memory size: ``memory_mb / mb_per_vcpu``, at most ``max_vcpus``."""
        return min(memory_mb / self.mb_per_vcpu, self.max_vcpus)

    def cpu_share(self, memory_mb: float) -> float:
        """The CPU the worker gets, in vCPUs: what Lambda gives, up to what it can use."""
        return min(self.vcpus(memory_mb), self.worker_vcpus)

    def compute_s(self, work: Work, memory_mb: float) -> float:
        seconds = work.samples * self.compute_s_per_sample + work.batches * self.compute_s_per_batch
        return seconds / self.cpu_share(memory_mb)

    def io_s(self, work: Work) -> float:
        moved = work.bytes_read + work.bytes_written
        transfer = moved / self.bandwidth_bytes_per_s if moved else 0.0
        return work.requests * self.request_latency_s + transfer

    def fixed_s(self, work: Work, cold: bool = False, slowdown: float = 1.0) -> float:
        """Everything but the training: cold start, overhead and I/O."""
        return (self.cold_start_s if cold else 0.0) + slowdown * (self.overhead_s + self.io_s(work))

    def duration_s(
        self, work: Work, memory_mb: float, cold: bool = False, slowdown: float = 1.0
    ) -> float:
        """The invocation's duration at a given slowdown (1: a typical invocation)."""
        return self.fixed_s(work, cold, slowdown) + slowdown * self.compute_s(work, memory_mb)

    def mean_slowdown(self) -> float:
        """The expected slowdown factor (jitter has mean one)."""
        low, high = self.straggler_slowdown
        return 1.0 + self.straggler_p * ((low + high) / 2.0 - 1.0)

    def mean_duration_s(self, work: Work, memory_mb: float, cold: bool = False) -> float:
        """Expected duration over stragglers and jitter (no time limit)."""
        return self.duration_s(work, memory_mb, cold, self.mean_slowdown())

    def draw_slowdown(self, rng: np.random.Generator) -> float:
        """One invocation's slowdown: straggler factor times jitter.

        Always draws the same number of variates, so a seeded generator gives the same
        sequence whatever the parameters.
        """
        straggler, pick, z = rng.random(), rng.random(), rng.standard_normal()
        factor = 1.0
        if straggler < self.straggler_p:
            low, high = self.straggler_slowdown
            factor = low + (high - low) * pick
        if self.jitter_sigma:
            factor *= math.exp(self.jitter_sigma * z - self.jitter_sigma**2 / 2.0)
        return factor


#: Measured on the local runtime with the real worker (``docs/simulator.md``): MovieLens
#: shards of 5,000 to 100,000 ratings, 8 factors, batch sizes 256 and 2,048, on a shared
#: two-core machine (hence the jitter). Calibrate your own for anything that matters.
DEFAULT_MODEL = PerformanceModel(
    compute_s_per_sample=2.3e-6,
    compute_s_per_batch=1.2e-4,
    overhead_s=0.018,
    cold_start_s=0.055,
    jitter_sigma=0.33,
)


# -- calibration -----------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationFit:
    """A fitted model and how well it fits the records it came from.

    ``rmse_s`` is the root mean squared error of the predicted durations (slowdowns
    known from the records' labels applied), ``relative_rmse`` the same of the relative
    errors (what the fit minimises), ``r_squared`` the share of the durations' variance
    explained, ``columns`` the parameters the least squares fitted (the others
    came from ``base``).
    """

    model: PerformanceModel
    records: int
    rmse_s: float
    relative_rmse: float
    r_squared: float
    columns: tuple[str, ...]


def _record_work(record: InvocationRecord) -> Work | None:
    """The work a measured invocation did, from its result and labels."""
    result = record.result if isinstance(record.result, dict) else {}
    labels = record.labels
    samples = result.get("samples_trained", labels.get("samples_trained"))
    if samples is None:
        shard = result.get("samples", labels.get("samples"))
        samples = None if shard is None else shard * int(labels.get("local_epochs", 1))
    if samples is None:
        return None
    batch_size = labels.get("batch_size")
    batches = 0
    if batch_size:
        per_pass = result.get("samples", labels.get("samples", samples))
        passes = max(1, math.ceil(int(samples) / max(int(per_pass), 1)))
        batches = math.ceil(int(per_pass) / int(batch_size)) * passes
    return Work(
        int(samples),
        batches,
        int(labels.get("bytes_read", 0)),
        int(labels.get("bytes_written", 0)),
    )


def _nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0: the best of the column subsets (few columns)."""
    n = x.shape[1]
    best, best_sse = np.zeros(n), float(y @ y)
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            cols = list(subset)
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(n)
            full[cols] = coef
            residual = y - x @ full
            sse = float(residual @ residual)
            if sse < best_sse - 1e-18:
                best, best_sse = full, sse
    return best


def fit_performance_model(
    records: Iterable[InvocationRecord],
    base: PerformanceModel | None = None,
    cpu_scaled: bool = False,
) -> CalibrationFit:
    """Fit compute per sample and per batch, overhead and cold start by least squares.

    Each successful record with a worker result (``samples_trained``, or ``samples``;
    a ``samples=`` label does too) gives one equation::

        duration_s - slowdown * io_s = slowdown * overhead_s
                                     + slowdown * samples * compute_s_per_sample / share
                                     + slowdown * batches * compute_s_per_batch / share
                                     + cold * cold_start_s

    where ``slowdown`` is the record's ``slowdown`` label (the local runtime's injected
    straggler factor; 1 without one), ``batches`` comes from a ``batch_size`` label,
    ``io_s`` uses ``base``'s store parameters and ``bytes_read``/``bytes_written``
    labels (zero by default: the calibration store's I/O then lands in the overhead and
    per-sample terms), and ``share`` is the model's CPU share at the record's memory
    if ``cpu_scaled`` (records from Lambda) or 1 (the local runtime does not throttle
    CPU by memory). The squares minimised are of relative errors (iteratively reweighted:
    each equation divided by its predicted duration), and the coefficients are
    constrained to be >= 0. A
    parameter the records cannot identify (no cold records, no ``batch_size`` labels,
    one shard size only) keeps ``base``'s value. ``jitter_sigma`` becomes the standard deviation of
    ``log(measured / predicted)``. Straggler and store parameters come from ``base``.

    Raises
    ------
    ValueError
        With fewer than two usable records, or records that cannot separate overhead
        from compute (a single amount of work).
    """
    base = base or PerformanceModel(compute_s_per_sample=0.0)
    rows: list[tuple[float, float, float, float]] = []
    targets: list[float] = []
    for record in records:
        if not record.ok:
            continue
        work = _record_work(record)
        if work is None:
            continue
        f = float(record.labels.get("slowdown", 1.0) or 1.0)
        share = base.cpu_share(record.memory_mb) if cpu_scaled else 1.0
        rows.append(
            (f, f * work.samples / share, f * work.batches / share, float(record.cold_start))
        )
        targets.append(record.duration_s - f * base.io_s(work))
    if len(rows) < 2:
        raise ValueError(
            f"calibration needs at least two successful worker records, got {len(rows)}"
        )
    x, y = np.asarray(rows), np.asarray(targets)
    names = ("overhead_s", "compute_s_per_sample", "compute_s_per_batch", "cold_start_s")
    kept: list[int] = []
    for column in range(len(names)):  # in order of priority; drop what adds no rank
        if np.linalg.matrix_rank(x[:, [*kept, column]]) == len(kept) + 1:
            kept.append(column)
    if 0 not in kept or 1 not in kept:
        raise ValueError(
            "calibration needs records of at least two amounts of work to separate the "
            "fixed overhead from the per-sample compute"
        )
    # Relative errors: every record weighs the same whatever its length, since runs of
    # a tenth of a second and of minutes should fit alike and timing noise is
    # multiplicative. Weighting by the prediction, not by the noisy measurement (which
    # would pull the fit below the mean), needs a few rounds: unweighted first.
    xk = x[:, kept]
    weight = np.ones(len(y))
    for _ in range(4):
        coef = _nonnegative_lstsq(xk * weight[:, None], y * weight)
        weight = 1.0 / np.maximum(xk @ coef, 1e-9)
    fitted = {names[c]: float(v) for c, v in zip(kept, coef, strict=True)}
    model = base.replace(**fitted)
    predicted = xk @ coef
    residual = y - predicted
    rmse = float(np.sqrt(np.mean(residual**2)))
    spread = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(residual @ residual) / spread if spread > 0 else 1.0
    positive = (predicted > 0) & (y > 0)
    if positive.sum() >= 2:
        model = model.replace(jitter_sigma=float(np.std(np.log(y[positive] / predicted[positive]))))
    relative = float(np.sqrt(np.mean((residual * weight) ** 2)))
    return CalibrationFit(model, len(rows), rmse, relative, r2, tuple(names[c] for c in kept))


def calibrate(
    records: Iterable[InvocationRecord],
    base: PerformanceModel | None = None,
    cpu_scaled: bool = False,
) -> PerformanceModel:
    """The model that fits measured records; see :func:`fit_performance_model`."""
    return fit_performance_model(records, base, cpu_scaled).model


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


# -- virtual time ------------------------------------------------------------------------


class VirtualClock:
    """Simulated seconds; only moves forward, and only when the simulation advances."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    @property
    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual time runs forward: {t} < {self._now}")
        self._now = float(t)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now})"


class _AdvancingEvent(threading.Event):
    """A waiter's event that, waited on, advances the simulations until it is set."""

    def __init__(self, initially_set: bool) -> None:
        super().__init__()
        self.sims: list[SimRuntime] = []
        if initially_set:
            self.set()

    def wait(self, timeout: float | None = None) -> bool:
        while not self.is_set():
            pending = [(t, i) for i, s in enumerate(self.sims) if (t := s._next_time()) is not None]
            if not pending:
                break
            self.sims[min(pending)[1]].step()
        return super().wait(0 if self.is_set() else timeout)


class _Waiters(list):
    """``Future._waiters`` of a :class:`SimFuture`.

    ``concurrent.futures.wait`` and ``as_completed`` register a waiter with each future
    and then block on the waiter's event; swapping that event for an
    :class:`_AdvancingEvent` makes the block advance the simulation instead.
    """

    def __init__(self, sim: SimRuntime) -> None:
        super().__init__()
        self.sim = sim

    def append(self, waiter: Any) -> None:
        event = getattr(waiter, "event", None)
        if isinstance(event, threading.Event):
            if not isinstance(event, _AdvancingEvent):
                event = _AdvancingEvent(event.is_set())
                waiter.event = event
            if self.sim not in event.sims:
                event.sims.append(self.sim)
        super().append(waiter)


class SimFuture(Future):
    """A future that completes when its runtime's virtual time reaches its end.

    ``result()`` and ``exception()`` advance the simulation until it has; so do
    ``concurrent.futures.wait`` and ``as_completed``. It cannot be cancelled (an
    invocation sent to Lambda runs to its end).
    """

    def __init__(self, sim: SimRuntime, record: InvocationRecord) -> None:
        super().__init__()
        self._sim = sim
        self._waiters = _Waiters(sim)
        #: The invocation's record, filled in as it starts and completes.
        self.record = record
        self.set_running_or_notify_cancel()

    def result(self, timeout: float | None = None) -> InvocationRecord:
        self._sim.run_until(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._sim.run_until(self)
        return super().exception(timeout)


@dataclass
class _Invocation:
    record: InvocationRecord
    future: SimFuture
    payload: dict[str, Any]
    work: Work | None
    failure: str | None
    timeout_s: float
    submitted: float
    status: str = OK


def _label_int(labels: dict[str, Any], name: str) -> int | None:
    value = labels.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"label {name}= must be an integer >= 0, got {value!r}")
    return int(value)


class SimRuntime(Runtime):
    """Lambda in virtual time; see the module docstring.

    Parameters
    ----------
    model
        Durations; :data:`DEFAULT_MODEL` (measured on the local runtime) if None.
    clock
        The virtual clock (a new one at 0 if None); read ``clock.now``.
    concurrency
        Invocations running at once; Lambda's default account limit is 1,000.
    samples_of
        ``payload -> int | Work``: the shard samples (or the full :class:`Work`) of an
        invocation; :class:`StoreWork` by default. A ``samples=`` label wins (with
        optional ``bytes_read=`` and ``bytes_written=`` labels).
    prices
        The meter; Lambda's x86 prices by default.
    seed
        Seeds stragglers and jitter: the same seed and submissions give the same run.
    keep_warm_s
        How long an idle container stays warm.
    stop_early
        Overrunning workers stop ``time_margin_s`` before the limit, as the worker
        does, instead of timing out.
    write_deltas
        Write an empty delta to each successful worker event's ``delta_key``.
    """

    name = "sim"

    def __init__(
        self,
        model: PerformanceModel | None = None,
        clock: VirtualClock | None = None,
        concurrency: int = 1000,
        samples_of: Callable[[dict[str, Any]], int | Work] | None = None,
        prices: LambdaPrices | None = None,
        seed: int = 0,
        keep_warm_s: float = 600.0,
        stop_early: bool = True,
        write_deltas: bool = False,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        _check("keep_warm_s", keep_warm_s, allow_inf=True)
        self.model = model or DEFAULT_MODEL
        self.clock = clock or VirtualClock()
        self.concurrency = concurrency
        self._store_work = StoreWork()
        self.samples_of = samples_of or self._store_work
        self.prices = prices or lambda_prices()
        self.keep_warm_s = keep_warm_s
        self.stop_early = stop_early
        self.write_deltas = write_deltas
        self.records: list[InvocationRecord] = []
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        self._events: list[tuple[float, int, _Invocation]] = []
        self._queue: deque[_Invocation] = deque()
        self._running = 0
        self._idle: dict[int, list[float]] = {}  # memory size -> times containers went idle
        self._ids = itertools.count()
        self._order = itertools.count()
        self._closed = False

    # -- submitting --------------------------------------------------------------------
    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> SimFuture:
        self.prices.check_memory(memory_mb)
        if not 0 < timeout_s <= self.prices.timeout_s_max:
            raise ValueError(f"timeout_s must be in (0, {self.prices.timeout_s_max}]")
        if self._closed:
            raise RuntimeError("cannot submit to a closed runtime")
        work, failure = self._work(payload, labels)
        with self._lock:
            record = InvocationRecord(
                f"sim-{next(self._ids):08d}", memory_mb=memory_mb, labels=dict(labels)
            )
            future = SimFuture(self, record)
            invocation = _Invocation(
                record, future, payload, work, failure, float(timeout_s), self.clock.now
            )
            if self._running < self.concurrency:
                self._start(invocation)
            else:
                self._queue.append(invocation)
        return future

    def _work(
        self, payload: dict[str, Any], labels: dict[str, Any]
    ) -> tuple[Work | None, str | None]:
        samples = _label_int(labels, "samples")
        if samples is not None:
            batch_size = payload.get("batch_size") if isinstance(payload, dict) else None
            epochs = int(payload.get("local_epochs", 1)) if isinstance(payload, dict) else 1
            work = Work.for_shard(
                samples,
                batch_size,
                epochs,
                _label_int(labels, "bytes_read") or 0,
                _label_int(labels, "bytes_written") or 0,
            )
            return work, None
        try:
            found = self.samples_of(payload)
        except UncostablePayload:
            raise  # nothing says how much work this is: the caller's mistake
        except Exception as exc:  # e.g. the shard is missing: the worker would fail too
            return None, f"{type(exc).__name__}: {exc}"
        if isinstance(found, Work):
            return found, None
        epochs = int(payload.get("local_epochs", 1))
        return Work.for_shard(int(found), payload.get("batch_size"), epochs), None

    def _start(self, invocation: _Invocation) -> None:
        now = self.clock.now
        record = invocation.record
        record.queued_s = now - invocation.submitted
        record.cold_start = not self._take_warm(record.memory_mb, now)
        slowdown = self.model.draw_slowdown(self._rng)
        record.labels["slowdown"] = slowdown
        record.labels["stopped_early"] = False
        record.labels["samples_trained"] = invocation.work.samples if invocation.work else 0
        model, limit = self.model, invocation.timeout_s
        if invocation.work is None:  # the worker fails while reading its inputs
            duration = model.fixed_s(Work(0), record.cold_start, slowdown)
            invocation.status, record.error = ERROR, invocation.failure
        else:
            work = invocation.work
            duration = model.duration_s(work, record.memory_mb, record.cold_start, slowdown)
            fixed = model.fixed_s(work, record.cold_start, slowdown)
            if duration > limit and self.stop_early and fixed < limit:
                margin = invocation.payload.get("time_margin_s", DEFAULT_TIME_MARGIN_S)
                stopped = max(limit - float(margin), fixed)
                share = (stopped - fixed) / (duration - fixed) if duration > fixed else 1.0
                record.labels["stopped_early"] = True
                record.labels["samples_trained"] = int(work.samples * min(share, 1.0))
                duration = stopped
        if duration > limit:
            duration, invocation.status, record.error = limit, TIMEOUT, "task timed out"
        record.duration_s = duration
        record.billed_ms = self.prices.billed_ms(duration * 1000)
        record.cost_usd = self.prices.invocation_cost(duration * 1000, record.memory_mb)
        heapq.heappush(self._events, (now + duration, next(self._order), invocation))
        self._running += 1

    def _take_warm(self, memory_mb: int, now: float) -> bool:
        idle = self._idle.get(memory_mb)
        if not idle:
            return False
        del idle[: bisect.bisect_left(idle, now - self.keep_warm_s)]  # reclaimed containers
        if not idle:
            return False
        idle.pop()  # the most recently used container
        return True

    # -- advancing -----------------------------------------------------------------------
    def _next_time(self) -> float | None:
        events = self._events
        return events[0][0] if events else None

    @property
    def pending(self) -> int:
        """Invocations submitted and not yet complete (running or queued)."""
        return len(self._events) + len(self._queue)

    def step(self) -> SimFuture | None:
        """Complete the next invocation in virtual time; its future, or None if idle."""
        with self._lock:
            if not self._events:
                return None
            finish, _, invocation = heapq.heappop(self._events)
            self.clock.advance_to(max(finish, self.clock.now))
            self._running -= 1
            record = invocation.record
            record.status = invocation.status
            if invocation.status != TIMEOUT:  # Lambda discards a timed-out container
                bisect.insort(self._idle.setdefault(record.memory_mb, []), finish)
            while self._queue and self._running < self.concurrency:
                self._start(self._queue.popleft())
            if self.write_deltas and record.ok:
                self._write_empty_delta(invocation.payload)
            self.records.append(record)
            invocation.future.set_result(record)
            return invocation.future

    def run_until(self, future: Future) -> None:
        """Advance until `future` is done (or nothing is left to complete)."""
        while not future.done() and self.step() is not None:
            pass

    def advance_to(self, t: float) -> list[SimFuture]:
        """Complete every invocation that ends by virtual time `t`, then set the clock to `t`."""
        done: list[SimFuture] = []
        with self._lock:
            while self._events and self._events[0][0] <= t:
                future = self.step()
                if future is not None:
                    done.append(future)
            self.clock.advance_to(max(t, self.clock.now))
        return done

    def run(self) -> list[SimFuture]:
        """Complete everything submitted; the futures in completion order."""
        done: list[SimFuture] = []
        while (future := self.step()) is not None:
            done.append(future)
        return done

    def close(self) -> None:
        """Pending invocations finish (in virtual time) first."""
        self.run()
        self._closed = True

    def _write_empty_delta(self, payload: dict[str, Any]) -> None:
        if not all(k in payload for k in ("store_url", "delta_key", "snapshot_key")):
            return
        url = payload["store_url"]
        factors = self._store_work.factors(url, payload["snapshot_key"])
        empty = {"format_version": np.array(DELTA_FORMAT_VERSION, dtype=np.int64)}
        for side in ("user", "item"):
            empty[f"{side}_rows"] = np.zeros(0, dtype=np.int64)
            empty[f"{side}_bias"] = np.zeros(0)
            empty[f"{side}_factors"] = np.zeros((0, factors))
            empty[f"{side}_count"] = np.zeros(0, dtype=np.int64)
        write_delta(self._store_work._open(url), payload["delta_key"], empty)


register_runtime("sim", SimRuntime)


# -- epochs without a coordinator ----------------------------------------------------------


@dataclass(frozen=True)
class EpochTiming:
    """One simulated epoch.

    ``duration_s`` runs from the epoch's launch to the κ-th fresh update (BSP: the last;
    ASP: the λ-th arrival) plus the coordinator's ``sync_overhead_s``. ``fresh`` and
    ``stale`` count the updates applied in the epoch computed on its own snapshot and on
    older ones; ``cost_usd`` is the bill of the invocations launched in the epoch
    (retries included), whenever they end.
    """

    epoch: int
    started_s: float
    finished_s: float
    launched: int
    fresh: int
    stale: int
    failed: int
    cost_usd: float

    @property
    def duration_s(self) -> float:
        return self.finished_s - self.started_s


@dataclass
class Simulation:
    """What :func:`simulate_epochs` returns: each epoch, every invocation, the totals."""

    epochs: list[EpochTiming]
    records: list[InvocationRecord]
    latency_s: float
    cost_usd: float

    @property
    def epoch_durations(self) -> list[float]:
        return [e.duration_s for e in self.epochs]


def simulate_epochs(
    kappa: int | str,
    workers: int,
    samples_per_worker: int | Sequence[int],
    epochs: int,
    model: PerformanceModel,
    *,
    memory_mb: int = 1769,
    batch_size: int | None = None,
    local_epochs: int = 1,
    bytes_read: int = 0,
    bytes_written: int = 0,
    timeout_s: float = 900.0,
    max_retries: int = 1,
    sync_overhead_s: float = 0.0,
    concurrency: int = 1000,
    seed: int = 0,
    stop_early: bool = True,
    keep_warm_s: float = 600.0,
    prices: LambdaPrices | None = None,
) -> Simulation:
    """Time κ-of-λ epochs the way the coordinator runs them, in virtual time.

    Parameters
    ----------
    kappa
        Updates each epoch waits for: an integer 1..workers (selective; ``workers`` is
        BSP), ``"bsp"``, or ``"asp"`` (every update applied on arrival and its worker
        relaunched at once; an epoch is ``workers`` arrivals).
    workers
        λ, workers per epoch, one shard each.
    samples_per_worker
        Shard size, one for all or one per worker.
    sync_overhead_s
        Coordinator seconds per model update (averaging deltas, writing the snapshot):
        once per epoch, or per arrival under ASP. Workers keep running meanwhile.

    As in :class:`retrain.coordinator.DistributedBackend`: an epoch launches the workers
    not still busy with an older epoch's shard; a straggler's update, arriving later,
    is applied (stale) in the epoch it arrives in; a failed or timed-out invocation is
    retried up to ``max_retries`` times in its epoch, then dropped. Stragglers still
    running after the last epoch are completed and billed, but do not add to
    ``latency_s``. Other parameters are as for :class:`SimRuntime` and :class:`Work`.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    asp = kappa == "asp"
    need = {"bsp": workers, "asp": 1}.get(kappa, kappa) if isinstance(kappa, str) else kappa
    if isinstance(need, str | bool) or not isinstance(need, int):
        raise ValueError(f"kappa must be 'bsp', 'asp' or an integer, got {kappa!r}")
    if not 1 <= need <= workers:
        raise ValueError(f"kappa must be within 1..{workers}, got {need}")
    sizes = (
        [int(samples_per_worker)] * workers
        if isinstance(samples_per_worker, int | np.integer)
        else [int(s) for s in samples_per_worker]
    )
    if len(sizes) != workers:
        raise ValueError(f"samples_per_worker has {len(sizes)} sizes for {workers} workers")
    _check("sync_overhead_s", sync_overhead_s)

    runtime = SimRuntime(
        model,
        concurrency=concurrency,
        prices=prices,
        seed=seed,
        keep_warm_s=keep_warm_s,
        stop_early=stop_early,
    )
    payload: dict[str, Any] = {"batch_size": batch_size, "local_epochs": local_epochs}
    running: dict[SimFuture, tuple[int, int, int]] = {}  # future -> worker, epoch, attempt
    arrived: deque[SimFuture] = deque()  # completed during the coordinator's own work
    launched: dict[int, list[InvocationRecord]] = {}  # epoch -> invocations it launched

    def launch(worker: int, epoch: int, attempt: int) -> None:
        future = runtime.submit(
            payload,
            memory_mb,
            timeout_s,
            samples=sizes[worker],
            bytes_read=bytes_read,
            bytes_written=bytes_written,
            worker=worker,
            epoch=epoch,
        )
        running[future] = (worker, epoch, attempt)
        launched.setdefault(epoch, []).append(future.record)

    def next_arrival() -> tuple[SimFuture, tuple[int, int, int]] | None:
        while not arrived:
            future = runtime.step()
            if future is None:
                return None
            arrived.append(future)
        future = arrived.popleft()
        return future, running.pop(future)

    def overhead() -> None:
        if sync_overhead_s:
            arrived.extend(runtime.advance_to(runtime.clock.now + sync_overhead_s))

    timings: list[EpochTiming] = []
    for epoch in range(epochs):
        started = runtime.clock.now
        busy = {worker for worker, _, _ in running.values()}
        idle = [w for w in range(workers) if w not in busy]
        for worker in idle:
            launch(worker, epoch, 0)
        fresh = stale = failed = 0
        arrivals = 0
        while running or arrived:
            if (asp and arrivals >= workers) or (not asp and fresh >= need):
                break
            got = next_arrival()
            if got is None:
                break
            future, (worker, computed_on, attempt) = got
            arrivals += 1
            record = future.result()
            if record.ok:
                fresh += computed_on == epoch
                stale += computed_on != epoch
                if asp:
                    overhead()
                    launch(worker, epoch, 0)
            else:
                failed += 1
                if attempt < max_retries:
                    launch(worker, computed_on, attempt + 1)
                elif asp:
                    launch(worker, epoch, 0)
        if not asp:
            overhead()
        timings.append(
            EpochTiming(epoch, started, runtime.clock.now, len(idle), fresh, stale, failed, 0.0)
        )
    latency = runtime.clock.now
    runtime.close()  # stragglers finish and are billed; only now is every cost known
    timings = [
        replace(t, cost_usd=sum(r.cost_usd for r in launched.get(t.epoch, []))) for t in timings
    ]
    total = sum(r.cost_usd for r in runtime.records)
    return Simulation(timings, list(runtime.records), latency, total)
