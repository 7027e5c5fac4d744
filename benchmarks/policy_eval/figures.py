"""From replays to the reported figures: paired accuracy, latencies, cost, curves, CIs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.policy_eval.run import Run, Scenario

#: Heartbeat windows the horizon is cut into for the paired accuracy (one per minute
#: over two hours).
WINDOWS = 120
RECOVERED = 0.95
#: Consecutive windows at A ≥ ``RECOVERED`` that count as recovered.
SUSTAINED = 5


def serving_errors(scenario: Scenario, run: Run) -> np.ndarray:
    """Each event's squared error under the model serving when it arrived (events
    from the bootstrap on; earlier ones are NaN), shape (n,). Between two swaps one rung
    serves, so its errors are asked for that span at once."""
    ladder, times = scenario.ladder, scenario.times
    starts = np.searchsorted(times, np.asarray(run.swap_times), side="left")
    ends = np.r_[starts[1:], times.size]
    errors = np.full(times.size, np.nan)
    for data_end, start, end in zip(run.swap_data_ends, starts, ends, strict=True):
        if end > start:
            errors[start:end] = ladder.errors[ladder.rung(data_end), int(start) : int(end)]
    return errors


def hit_rate(scenario: Scenario, run: Run) -> float:
    """Hit-rate@10 on the ladder's sampled liked events under the model serving then."""
    ladder = scenario.ladder
    if ladder.hit_events.size == 0:
        return float("nan")
    rungs = np.array([ladder.rung(end) for end in run.swap_data_ends])
    at = np.searchsorted(run.swap_times, scenario.times[ladder.hit_events], side="right") - 1
    live = at >= 0
    hits = ladder.hits[rungs[at[live]], np.flatnonzero(live)]
    return float(hits.mean()) if hits.size else float("nan")


def window_rmse(scenario: Scenario, errors: np.ndarray) -> np.ndarray:
    """RMSE per heartbeat window (NaN where a window has no evaluated event)."""
    edges = np.linspace(scenario.start_s, scenario.horizon_s, WINDOWS + 1)
    which = np.searchsorted(edges, scenario.times, side="right") - 1
    kept = (which >= 0) & (which < WINDOWS) & ~np.isnan(errors)
    sums = np.bincount(which[kept], weights=errors[kept], minlength=WINDOWS)[:WINDOWS]
    counts = np.bincount(which[kept], minlength=WINDOWS)[:WINDOWS]
    out = np.full(WINDOWS, np.nan)
    np.sqrt(sums / counts, out=out, where=counts > 0)
    return out


def serving_windows(scenario: Scenario, run: Run) -> np.ndarray:
    """``run``'s RMSE per heartbeat window: the yardstick best-effort's, computed once."""
    return window_rmse(scenario, serving_errors(scenario, run))


def incorporation_latency(scenario: Scenario, run: Run) -> float:
    """Mean seconds from an event's arrival to the swap of a model trained on it; an
    event no model took in by the end counts until the horizon."""
    first = scenario.ladder.bootstrap
    times = scenario.times[first:]
    ends = np.maximum.accumulate(np.asarray(run.swap_data_ends))
    swaps = np.asarray(run.swap_times)
    index = np.arange(first, scenario.times.size)
    taken = np.searchsorted(ends, index, side="right")
    at = np.where(taken < swaps.size, swaps[np.minimum(taken, swaps.size - 1)], scenario.horizon_s)
    return float(np.mean(np.maximum(at - times, 0.0)))


def recovery(scenario: Scenario, accuracy: np.ndarray, sustained: int = SUSTAINED) -> float:
    """Mean over drifts of the seconds from onset to the start of the first ``sustained``
    consecutive windows at A ≥ 0.95 (a single window is too noisy to call a recovery);
    a drift never recovered from counts until the next onset or the horizon."""
    edges = np.linspace(scenario.start_s, scenario.horizon_s, WINDOWS + 1)
    bounds = [*scenario.onsets_s, float(scenario.horizon_s)]
    spans = []
    for onset, until in zip(bounds[:-1], bounds[1:], strict=True):
        first = int(np.searchsorted(edges, onset, side="right")) - 1
        last = int(np.searchsorted(edges, until, side="left"))
        good = accuracy[max(first, 0) : last] >= RECOVERED
        runs = np.convolve(good.astype(int), np.ones(sustained, dtype=int), mode="valid")
        hits = np.flatnonzero(runs == sustained)
        if hits.size == 0:
            spans.append(until - onset)
        else:
            spans.append(max(0.0, float(edges[max(first, 0) + hits[0]]) - onset))
    return float(np.mean(spans))


def reaction(scenario: Scenario, run: Run) -> float:
    """Mean over drifts of the seconds from onset to the start of the first job after
    it (a drift alert's job, a batch, a period): how long the policy took to act, apart
    from how long its job then ran; a drift no job followed counts until the next onset
    or the horizon."""
    starts = np.array([job.start_s for job in run.jobs])
    bounds = [*scenario.onsets_s, float(scenario.horizon_s)]
    spans = []
    for onset, until in zip(bounds[:-1], bounds[1:], strict=True):
        after = starts[(starts >= onset) & (starts < until)]
        spans.append(float(after.min()) - onset if after.size else until - onset)
    return float(np.mean(spans))


@dataclass(frozen=True)
class RunFigures:
    """One replay's figures against best-effort on the same runtime and seed."""

    cost_usd: float
    cost_per_1k_events_usd: float
    mean_accuracy: float
    p10_accuracy: float
    share_090: float
    share_095: float
    rmse: float
    hit_rate_at_10: float
    retrain_s: float
    jobs: int
    incorporation_latency_s: float
    recovery_s: float
    reaction_s: float


def run_figures(scenario: Scenario, run: Run, best_effort: Run | np.ndarray) -> RunFigures:
    """``run``'s figures against ``best_effort``'s replay, or its :func:`serving_windows`."""
    errors = serving_errors(scenario, run)
    mine = window_rmse(scenario, errors)
    theirs = (
        best_effort
        if isinstance(best_effort, np.ndarray)
        else serving_windows(scenario, best_effort)
    )
    accuracy = theirs / mine
    valid = accuracy[~np.isnan(accuracy)]
    arrivals = scenario.weight * scenario.times.size
    durations = [job.finish_s - job.start_s for job in run.jobs]
    return RunFigures(
        cost_usd=run.cost_usd,
        cost_per_1k_events_usd=1000 * run.cost_usd / arrivals,
        mean_accuracy=float(valid.mean()),
        p10_accuracy=float(np.percentile(valid, 10)),
        share_090=float(np.mean(valid >= 0.90)),
        share_095=float(np.mean(valid >= 0.95)),
        rmse=float(np.sqrt(np.nanmean(errors))),
        hit_rate_at_10=hit_rate(scenario, run),
        retrain_s=float(np.mean(durations)) if durations else 0.0,
        jobs=len(run.jobs),
        incorporation_latency_s=incorporation_latency(scenario, run),
        recovery_s=recovery(scenario, np.nan_to_num(accuracy, nan=1.0)),
        reaction_s=reaction(scenario, run),
    )


def cost_at(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The cost at accuracy ``target`` read off a cost–accuracy curve of (cost, A)
    points: along the points in order of cost, the cheapest point at or above
    ``target``, interpolated linearly from the point before it; None if none reaches it.

    >>> round(cost_at([(1.0, 0.80), (2.0, 0.92), (4.0, 0.99)], 0.90), 4)
    1.8333
    >>> cost_at([(1.0, 0.95)], 0.90), cost_at([(1.0, 0.5)], 0.9) is None
    (1.0, True)
    """
    ordered = sorted(points)
    for k, (cost, accuracy) in enumerate(ordered):
        if accuracy >= target:
            if k == 0:
                return cost
            low_cost, low_acc = ordered[k - 1]
            if low_acc >= accuracy:
                return cost
            share = (target - low_acc) / (accuracy - low_acc)
            return low_cost + max(0.0, share) * (cost - low_cost)
    return None


def bootstrap_ci(
    values: Sequence[float], seed: int = 0, draws: int = 2_000
) -> tuple[float, float] | None:
    """95 % percentile bootstrap interval of the mean of ``values`` (over seeds)."""
    finite = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if finite.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = rng.choice(finite, size=(draws, finite.size)).mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
