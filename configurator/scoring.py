"""The posterior of the kept candidates: prior plus residual GPs, and P(on time).

Each kept row's log latency, cost and progress are the analytic model's plus its
residual GPs' means; its objective is cost per progress once it follows itself, plus
this epoch's switching cost amortised over the epochs left. P(on time) is the lower of
the latency posterior's (a log-normal, widened by :mod:`configurator.conformal`) and the
order statistic's own under the model's slowdown mixture, which sees the cliff stragglers
put past its 90th percentile; and a pick must also be on time once it follows itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from configurator.base import JobContext, Observation
from configurator.epoch_model import EpochModel, Prediction
from configurator.residuals import OUTPUTS, ResidualGps
from configurator.shares import share_after
from configurator.slowdowns import Z90
from configurator.space import Candidates


@dataclass(frozen=True)
class Scored:
    """The kept candidates with their posterior (natural logs)."""

    rows: np.ndarray
    lat: np.ndarray
    lat_sd: np.ndarray
    cost: np.ndarray
    cost_sd: np.ndarray
    objective: np.ndarray
    objective_sd: np.ndarray
    p_feasible: np.ndarray
    #: P(on time) of each row once it follows itself (no switch's cold starts), at the
    #: share left to the later epochs after this one.
    p_staying: np.ndarray
    #: The factor latency spreads were widened by (:mod:`configurator.conformal`).
    widening: float


def on_time(
    log_deadline: float | np.ndarray,
    log_latency: np.ndarray,
    model_sd: np.ndarray,
    total_sd: np.ndarray,
    tail: np.ndarray,
) -> np.ndarray:
    """P(on time) from the lower of the log-normal's score and the order statistic's
    ``tail`` score, both in units of the model's own spread, widened to the posterior's
    ``total_sd``."""
    z = np.minimum((log_deadline - log_latency) / model_sd, tail)
    return np.asarray(ndtr(z * model_sd / total_sd))


class Scorer:
    """Scores grid rows for a job.

    Parameters
    ----------
    grid
        The candidates, whose rows are scored.
    context
        The job.
    gps
        The residual GPs.
    """

    def __init__(self, grid: Candidates, context: JobContext, gps: ResidualGps) -> None:
        self._grid = grid
        self._context = context
        self._gps = gps

    def score(
        self,
        rows: np.ndarray,
        now: Prediction,
        steady: Prediction,
        history: Sequence[Observation],
        samples: int,
        left: int,
        deadline: float,
        budget: float,
        model: EpochModel,
        widen: float,
    ) -> Scored:
        """Posterior of ``rows`` at this epoch (one of ``left``) with a share of
        ``deadline`` seconds and ``budget`` dollars: ``now`` and ``steady`` are the
        ``model``'s predictions after the current config and after itself, ``widen``
        the latency spread's widening."""
        lat, lat_sd = now.log_latency[rows], now.log_latency_sd[rows]
        cost, cost_sd = now.log_cost[rows], now.log_cost_sd[rows]
        steady_cost, progress = steady.log_cost[rows], steady.log_progress[rows]
        steady_lat, steady_lat_sd = steady.log_latency[rows], steady.log_latency_sd[rows]
        epi = {name: np.zeros(len(rows)) for name in OUTPUTS}
        if self._gps.applies(history):
            shifts, epi = self._gps.shifts(rows, samples)
            lat, cost = lat + shifts["latency"], cost + shifts["cost"]
            steady_lat = steady_lat + shifts["latency"]
            steady_cost = steady_cost + shifts["cost"]
            progress = progress + shifts["progress"]
        switching = np.log1p(np.maximum(np.exp(cost - steady_cost) - 1.0, 0.0) / left)
        objective = steady_cost + switching - progress
        objective_sd = np.sqrt(epi["cost"] + epi["progress"])
        total_lat_sd = widen * np.sqrt(lat_sd**2 + epi["latency"])
        total_cost_sd = np.sqrt(cost_sd**2 + epi["cost"])
        # A GPU container's start-up is planned into the job: this epoch may take it on
        # top of its share, if the later epochs, their shares shrunk by it, are on time.
        previous = history[-1].config if history else None
        planned = model.planned_startup_s(self._grid.take(rows), previous)
        log_now: float | np.ndarray = math.log(deadline)
        log_later: float | np.ndarray = log_now
        if planned.any():
            log_now = np.log(deadline + planned)
            later = share_after(deadline, left, lat + Z90 * total_lat_sd)
            log_later = np.log(np.where(planned > 0, later, deadline))
        tail_now, tail_steady = self._tail_scores(
            rows, history, samples, (log_now, log_later), lat - now.log_latency[rows], model
        )
        p = on_time(log_now, lat, lat_sd, total_lat_sd, tail_now)
        # A pick must also be one the job can stay on: an epoch that meets its share only
        # because the last one left every container warm (a small λ after a large one)
        # runs late as soon as it follows itself, and a late epoch shrinks every later
        # epoch's share.
        steady_sd = widen * np.sqrt(steady_lat_sd**2 + epi["latency"])
        staying = on_time(log_later, steady_lat, steady_lat_sd, steady_sd, tail_steady)
        p = np.minimum(p, staying)
        # What a fallback that switches plans on: the config following itself at the
        # share the later epochs get once this one has run (its 90th percentile), not
        # at this one's: a switch planned late shrinks every later share, and a config
        # at the boundary of this share would be out of reach the next epoch.
        after = share_after(deadline, left, lat + Z90 * total_lat_sd)
        staying = ndtr((np.log(after) - steady_lat) / steady_sd)
        if math.isfinite(budget):
            within = ndtr((math.log(budget) - cost) / total_cost_sd)
            p, staying = p * within, staying * within
        return Scored(
            rows, lat, total_lat_sd, cost, total_cost_sd, objective, objective_sd, p, staying, widen
        )

    def _tail_scores(
        self,
        rows: np.ndarray,
        history: Sequence[Observation],
        samples: int,
        log_deadlines: tuple[float | np.ndarray, float | np.ndarray],
        shift: np.ndarray,
        model: EpochModel,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The order statistic's own P(on time) of ``rows`` as normal scores, this epoch
        and following itself (:meth:`EpochModel.on_time_scores`), at the log deadlines
        of each, the residual GP's ``shift`` of log latency taken off them: where the
        straggler tail is a cliff past the 90th percentile, the log-normal's score is
        too high."""
        cands = self._grid.take(rows)
        previous = history[-1].config if history else None
        log_now, log_later = log_deadlines
        if log_now is log_later:
            now, steady = model.on_time_scores(
                cands, self._context, (previous, cands), log_now - shift, samples=samples
            )
            return now, steady
        (now,) = model.on_time_scores(
            cands, self._context, (previous,), log_now - shift, samples=samples
        )
        (steady,) = model.on_time_scores(
            cands, self._context, (cands,), log_later - shift, samples=samples
        )
        return now, steady
