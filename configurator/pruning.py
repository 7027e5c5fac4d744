"""Pruning: the rows of the grid worth scoring with the residual GPs.

Candidates past the workers' time limit, those the prior deems infeasible with high
probability even allowing for its own error, and those ε-dominated in latency and cost per
progress (CE-scaling's Pareto boundary, widened by what the residual GPs could still
change) are dropped; at most ``keep`` remain, places kept for the cheapest rows the prior
deems likely on time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.special import ndtri

from configurator.epoch_model import Prediction
from configurator.gp_settings import GpOptSettings
from configurator.slowdowns import Z90
from configurator.space import Candidates, EpochConfig


class Pruner:
    """Prunes a job's grid.

    Parameters
    ----------
    grid
        The candidates.
    timeout_s
        The workers' time limit, for all rows or per row (kinds have their own): a row
        whose straggler would pass it is out.
    settings
        :class:`~configurator.gp_settings.GpOptSettings` (``keep``, ``confidence``).
    prior_sd
        Per output, how far its residual GP could move a prediction.
    """

    def __init__(
        self,
        grid: Candidates,
        timeout_s: float | np.ndarray,
        settings: GpOptSettings,
        prior_sd: Callable[[str], float],
    ) -> None:
        self._grid = grid
        self._timeout_s = timeout_s
        self.settings = settings
        self._prior_sd = prior_sd

    def prune(
        self,
        now: Prediction,
        steady: Prediction,
        deadline: float,
        current: EpochConfig | None = None,
        planned: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows worth scoring, at most ``keep``: the cheapest rows the prior alone deems
        likely on time (a quarter of the places for rows on time even after a switch, a
        quarter for rows on time once warm, the fallback's when no row is on time now,
        and a quarter for rows that keep the current memory and λ, which it weighs too),
        then the cheapest of the rest that are within the time limit, not infeasible
        with high probability and not ε-dominated.

        The cheapest rows are the slowest: cut by cost alone, the kept ones can all be
        unlikely on time while thousands of dearer ones would be; and dominance judged
        on this epoch's latency drops rows that are on time only once warm.

        ``planned`` is each row's start-up planned into the job (a GPU container's),
        which this epoch may take on top of ``deadline``.
        """
        within_limit = now.worker_tail_s < self._timeout_s
        objective = steady.log_cost - steady.log_progress
        quarter = max(1, self.settings.keep // 4)
        if planned is not None and planned.any():
            now = replace(now, log_latency=now.log_latency - np.log1p(planned / deadline))
        on_time = self.likely_on_time(now, steady, deadline) & within_limit
        once_warm = self.likely_on_time(steady, steady, deadline) & within_limit & ~on_time
        staying = np.zeros(len(on_time), dtype=bool)
        if current is not None:
            staying = self._grid.keeps(np.arange(len(on_time)), current) & within_limit
            staying &= ~on_time & ~once_warm
        sure = np.concatenate(
            [
                cheapest(objective, np.flatnonzero(on_time), quarter),
                cheapest(objective, np.flatnonzero(once_warm), quarter),
                cheapest(objective, np.flatnonzero(staying), quarter),
            ]
        )[: self.settings.keep]
        epistemic = self._prior_sd("latency")
        sd = np.sqrt(now.log_latency_sd**2 + epistemic**2)
        # P(on time) ≥ 1 − confidence, as a z-score: no normal CDF over the whole grid.
        z = ndtri(1 - self.settings.confidence)
        plausible = math.log(deadline) - now.log_latency >= z * sd
        plausible &= within_limit
        plausible[sure] = False
        rows = np.flatnonzero(plausible)
        room = self.settings.keep - len(sure)
        if not len(rows):  # nothing else could meet the deadline: the surest fast ones
            fastest = np.argsort(now.log_latency + Z90 * sd)
            return np.concatenate([sure, fastest[~np.isin(fastest, sure)][:room]])
        eps = math.hypot(self._prior_sd("cost"), self._prior_sd("progress"))
        rows = rows[undominated(now.log_latency[rows], objective[rows], epistemic, eps)]
        return np.concatenate([sure, cheapest(objective, rows, room)])

    def likely_on_time(self, now: Prediction, steady: Prediction, deadline: float) -> np.ndarray:
        """Per row, whether the prior alone gives it ``confidence`` of meeting
        ``deadline`` this epoch and when it follows itself."""
        later = now.log_latency >= steady.log_latency
        latency = np.where(later, now.log_latency, steady.log_latency)
        sd = np.where(later, now.log_latency_sd, steady.log_latency_sd)
        return math.log(deadline) - latency >= ndtri(self.settings.confidence) * sd


def cheapest(objective: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` of ``rows`` (ascending) lowest in ``objective``, in order, ties by row:
    what a stable sort of the whole grid would give, from a partial selection (sorting
    the whole grid would cost a good part of a decision)."""
    if n <= 0:
        return rows[:0]
    values = objective[rows]
    if len(rows) > n:
        kth = np.partition(values, n - 1)[n - 1]
        rows = np.concatenate([rows[values < kth], rows[values == kth]])[:n]
        values = objective[rows]
    return rows[np.lexsort((rows, values))]


def undominated(
    latency: np.ndarray, objective: np.ndarray, eps_lat: float, eps_obj: float
) -> np.ndarray:
    """Mask of the points no other point beats by more than ``eps`` in both latency and
    objective (CE-scaling's Pareto pruning, widened by what the GPs could change)."""
    order = np.argsort(latency)
    lat, obj = latency[order], objective[order]
    best_before = np.minimum.accumulate(obj)
    # For each point: the best objective among points at least eps_lat faster.
    idx = np.searchsorted(lat, lat - eps_lat, side="right") - 1
    rival = np.where(idx >= 0, best_before[np.maximum(idx, 0)], np.inf)
    keep_sorted = obj <= rival + eps_obj
    keep = np.empty_like(keep_sorted)
    keep[order] = keep_sorted
    return keep
