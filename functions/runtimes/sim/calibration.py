"""Fitting the performance model to measured invocations of the real worker."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from functions.runtimes.base import InvocationRecord
from functions.runtimes.sim.model import (
    PerformanceModel,
    Work,
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
    records: Iterable[InvocationRecord],
    base: PerformanceModel | None = None,
    cpu_scaled: bool = False,
) -> PerformanceModel:
    """The model that fits measured records; see :func:`fit_performance_model`."""
    return fit_performance_model(records, base, cpu_scaled).model
