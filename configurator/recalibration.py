"""Recalibration: the epoch model refitted after every epoch to the job's own records.

From the recent epochs' λ invocation records: the per-sample and fixed seconds (the
worker model's least squares, when the records hold several amounts of work; a common
scale otherwise), the empirical slowdown distribution, the cold-start seconds, the
coordinator's seconds and the progress curve. What it still gets wrong is the residual
GPs' job (:mod:`configurator.surrogate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from configurator.base import JobContext, Observation, WorkerRun
from configurator.epoch_model import SAMPLE_BYTES, EpochModel, delta_bytes
from configurator.progress import fit_progress, progress_sd
from configurator.slowdowns import pooled
from configurator.space import LAMBDA, Candidates
from functions.performance import PerformanceModel, Work, fit_performance_model

#: Invocation records per epoch, and epochs, a recalibration looks at: recent ones, so
#: that the model follows a job whose window grew, and few, so it takes milliseconds.
RECORDS_PER_EPOCH = 64
RECENT_EPOCHS = 8
#: Epochs whose records stand for the slowdown distribution: a property of the fleet,
#: not of the window, so more of them (a job of one or two workers an epoch needs a
#: few dozen epochs to show its stragglers).
SLOWDOWN_EPOCHS = 32


def recalibrate(
    model: EpochModel, history: Sequence[Observation], context: JobContext
) -> EpochModel:
    """``model`` refitted to the invocation records and outcomes of ``history``: Lambda's
    worker from the Lambda records, every other kind from its own
    (:meth:`KindModel.recalibrated <configurator.kinds.KindModel.recalibrated>`)."""
    recent = _recent_runs(history, RECENT_EPOCHS)
    longer = _recent_runs(history, SLOWDOWN_EPOCHS)
    worker, (slowdowns, records) = _fit_workers(
        model, _of_kind(recent, LAMBDA), _of_kind(longer, LAMBDA), context
    )
    fitted = replace(model, worker=worker, slowdowns=slowdowns, slowdown_records=records)
    others = {r.kind for r, _ in longer} - {LAMBDA}
    if others:
        kinds = dict(model.kinds)
        for name in others & set(kinds):
            runs = [r for r, _ in _of_kind(longer, name)]
            kinds[name] = model.kinds[name].recalibrated(runs, context)
        fitted = replace(fitted, kinds=kinds)
    fitted = replace(fitted, coordinator_s=_fit_coordinator(fitted, history, context))
    progress = fit_progress(fitted.progress, history, context)
    return replace(fitted, progress=progress, progress_sd=progress_sd(fitted.progress_sd, history))


def _recent_runs(history: Sequence[Observation], epochs: int) -> list[tuple[WorkerRun, int]]:
    """(run, epoch) of the last ``epochs`` epochs' successful invocations, evenly
    thinned."""
    runs: list[tuple[WorkerRun, int]] = []
    for t in range(max(0, len(history) - epochs), len(history)):
        ok = [r for r in history[t].workers if r.ok and r.duration_s > 0]
        step = max(1, len(ok) // RECORDS_PER_EPOCH)
        runs.extend((r, t) for r in ok[::step])
    return runs


def _of_kind(runs: list[tuple[WorkerRun, int]], kind: str) -> list[tuple[WorkerRun, int]]:
    """The runs of worker kind ``kind``."""
    return [(r, t) for r, t in runs if r.kind == kind]


def _work(run: WorkerRun, context: JobContext) -> Work:
    n = run.samples
    batches = math.ceil(n / run.batch_size) if run.batch_size else 0
    written = int(delta_bytes(np.asarray(float(n)), context))
    return Work(n, batches, context.snapshot_bytes + n * SAMPLE_BYTES, written)


def _fit_workers(
    model: EpochModel,
    runs: list[tuple[WorkerRun, int]],
    longer: list[tuple[WorkerRun, int]],
    context: JobContext,
) -> tuple[PerformanceModel, tuple[np.ndarray, float]]:
    """The worker's seconds (from the recent ``runs``) and the empirical slowdowns of
    the warm runs among the ``longer`` history, with the records they stand for.

    Two candidate fits of the warm runs' median duration per kind of work (shard size,
    memory, batch size; medians, so that stragglers do not pull the fit): the prior's
    seconds times a common scale, and the worker model's least squares of per-sample and
    fixed seconds, tried only when the runs hold three amounts of work spanning 4x.
    Least squares on a few noisy points extrapolates wildly (it can put every second in
    the fixed overhead), so it is kept only when it explains the medians clearly better
    than the scale does.
    """
    warm = [r for r, _ in runs if not r.cold_start]
    if len(warm) < 2:
        cold_only = [r for r, _ in runs]
        if len(cold_only) < 2:
            return model.worker, (model.slowdowns, model.slowdown_records)
        return model.worker, pooled(model.slowdowns, _cold_ratios(model.worker, cold_only, context))
    groups: dict[tuple[int, int, int | None], list[float]] = {}
    for r in warm:
        groups.setdefault((r.samples, r.memory_mb, r.batch_size), []).append(r.duration_s)
    medians = [
        WorkerRun(memory, samples, float(np.median(d)), False, batch)
        for (samples, memory, batch), d in groups.items()
    ]
    worker = _scaled(model.worker, _median_ratio(model.worker, warm, context))
    sizes = sorted({r.samples for r in medians})
    if len(sizes) >= 3 and sizes[-1] >= 4 * max(sizes[0], 1):
        fitted = _least_squares(model.worker, medians)
        if fitted is not None and _keeps_compute(fitted, worker):
            fitted = _scaled(fitted, _median_ratio(fitted, warm, context))
            if _log_sse(fitted, medians, context) < 0.7 * _log_sse(worker, medians, context):
                worker = fitted
    observed = [r for r, _ in longer if not r.cold_start]
    predicted = np.array([worker.duration_s(_work(r, context), r.memory_mb) for r in observed])
    ratios = np.array([r.duration_s for r in observed]) / np.maximum(predicted, 1e-9)
    cold = [r for r, _ in runs if r.cold_start]
    if cold:
        extra = [r.duration_s - worker.duration_s(_work(r, context), r.memory_mb) for r in cold]
        worker = worker.replace(cold_start_s=max(0.0, float(np.median(extra))))
    return worker, pooled(model.slowdowns, ratios / float(np.median(ratios)))


def _keeps_compute(fitted: PerformanceModel, scaled: PerformanceModel) -> bool:
    """Whether a least-squares fit left at least half the per-sample compute seconds
    of the scaled prior in place.

    Which seconds a smaller memory size slows down (compute) and which it does not
    (overhead, transfer) only runs at several memory sizes could show; a job's runs
    at one size leave that to noise, and a fit that moves the per-sample seconds into
    the fixed ones makes a small memory size look as fast as a large one.
    """
    return fitted.compute_s_per_sample >= 0.5 * scaled.compute_s_per_sample


def _median_ratio(worker: PerformanceModel, runs: list[WorkerRun], context: JobContext) -> float:
    """The runs' median duration over what ``worker`` predicts for them."""
    predicted = np.array([worker.duration_s(_work(r, context), r.memory_mb) for r in runs])
    return float(np.median(np.array([r.duration_s for r in runs]) / np.maximum(predicted, 1e-9)))


@dataclass(frozen=True)
class _Measured:
    """A warm worker run as :func:`~functions.performance.fit_performance_model` reads
    a measured invocation."""

    memory_mb: int
    duration_s: float
    labels: dict[str, Any]
    ok: bool = True
    cold_start: bool = False
    init_duration_s: float = 0.0
    result: dict[str, Any] | None = None


def _least_squares(worker: PerformanceModel, runs: list[WorkerRun]) -> PerformanceModel | None:
    records = [
        _Measured(r.memory_mb, r.duration_s, {"samples": r.samples, "batch_size": r.batch_size})
        for r in runs
    ]
    try:
        return fit_performance_model(records, worker, cpu_scaled=True).model
    except ValueError:
        return None


def _log_sse(worker: PerformanceModel, runs: list[WorkerRun], context: JobContext) -> float:
    predicted = np.array([worker.duration_s(_work(r, context), r.memory_mb) for r in runs])
    observed = np.array([r.duration_s for r in runs])
    return float(np.sum(np.log(observed / np.maximum(predicted, 1e-9)) ** 2))


def _cold_ratios(
    worker: PerformanceModel, runs: list[WorkerRun], context: JobContext
) -> np.ndarray:
    """Slowdowns of cold runs alone (a job's first epoch): their seconds past the
    prior's cold start over the prior's warm duration."""
    return np.array(
        [
            max(r.duration_s - worker.cold_start_s, 1e-9)
            / max(worker.duration_s(_work(r, context), r.memory_mb), 1e-9)
            for r in runs
        ]
    )


def _scaled(worker: PerformanceModel, scale: float) -> PerformanceModel:
    """Every slowdown-scaled second of ``worker`` times ``scale``."""
    return worker.replace(
        compute_s_per_sample=worker.compute_s_per_sample * scale,
        compute_s_per_batch=worker.compute_s_per_batch * scale,
        overhead_s=worker.overhead_s * scale,
        request_latency_s=worker.request_latency_s * scale,
        bandwidth_bytes_per_s=worker.bandwidth_bytes_per_s / scale,
    )


def _fit_coordinator(
    model: EpochModel, history: Sequence[Observation], context: JobContext
) -> tuple[float, float]:
    """The coordinator's seconds ``a + b·κ``: epoch latency minus its κ-th fastest worker,
    by non-negative least squares over the recent epochs."""
    rows, targets = [], []
    for obs in history[-RECENT_EPOCHS:]:
        durations = sorted(r.duration_s for r in obs.workers if r.ok)
        kappa = int(Candidates.of([obs.config]).kappa[0])
        if len(durations) >= kappa:
            rows.append((1.0, float(kappa)))
            targets.append(max(0.0, obs.duration_s - durations[kappa - 1]))
    if not rows:
        return model.coordinator_s
    x, y = np.asarray(rows), np.asarray(targets)
    if len({r[1] for r in rows}) < 2:
        return (float(np.median(y)), 0.0)
    best, best_sse = (float(np.median(y)), 0.0), math.inf
    for cols in ([0], [1], [0, 1]):
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(2)
        full[cols] = coef
        sse = float(np.sum((y - x @ full) ** 2))
        if sse < best_sse:
            best, best_sse = (float(full[0]), float(full[1])), sse
    return best
