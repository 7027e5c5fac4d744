"""The worker performance model: how long one worker invocation takes on Lambda, and why.

A :class:`PerformanceModel` predicts an invocation's seconds from its :class:`Work` and
memory size; :func:`fit_performance_model` fits one to measured invocations. The ``sim``
runtime (:mod:`functions.runtimes.sim`) draws its virtual durations from it and the
configurator (:mod:`configurator.performance`) predicts epochs with it, so it lives here,
beside the price file it reads, and imports no runtime.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol

import numpy as np

from functions.pricing import lambda_prices

#: Object-store requests of one worker invocation: get snapshot, get shard, put delta.
WORKER_REQUESTS = 3
#: The worker's default ``time_margin_s`` (:class:`functions.handler.WorkerTask`).
DEFAULT_TIME_MARGIN_S = 20.0


def lambda_mb_per_vcpu() -> float:
    return float(lambda_prices().mb_per_vcpu)


def check_number(
    name: str, value: float, *, positive: bool = False, allow_inf: bool = False
) -> None:
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
    mb_per_vcpu: float = field(default_factory=lambda_mb_per_vcpu)
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
            check_number(name, getattr(self, name))
        check_number(
            "bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, positive=True, allow_inf=True
        )
        for name in ("worker_vcpus", "mb_per_vcpu", "max_vcpus"):
            check_number(name, getattr(self, name), positive=True)
        check_number("straggler_p", self.straggler_p)
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


class MeasuredInvocation(Protocol):
    """What a fit reads of one measured invocation: a runtime's ``InvocationRecord``
    (:mod:`functions.runtimes.base`) has it all."""

    @property
    def ok(self) -> bool: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def cold_start(self) -> bool: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def init_duration_s(self) -> float: ...
    @property
    def result(self) -> Mapping[str, Any] | None: ...
    @property
    def labels(self) -> Mapping[str, Any]: ...


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


def _record_work(record: MeasuredInvocation) -> Work | None:
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
    records: Iterable[MeasuredInvocation],
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
        # A cold start's initialisation, where the runtime reports it apart (Lambda's
        # Init Duration, the local runtime's container start), is part of what the
        # model's cold_start_s stands for.
        measured = record.duration_s + record.init_duration_s
        targets.append(measured - f * base.io_s(work))
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
    records: Iterable[MeasuredInvocation],
    base: PerformanceModel | None = None,
    cpu_scaled: bool = False,
) -> PerformanceModel:
    """The model that fits measured records; see :func:`fit_performance_model`."""
    return fit_performance_model(records, base, cpu_scaled).model
