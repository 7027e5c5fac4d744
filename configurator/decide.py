"""The pick among the scored candidates: the safe incumbent, safe exploration, fallbacks.

Feasible means ``P(on time) ≥ confidence`` (and within the budget). The incumbent is the
feasible candidate with the best posterior-mean cost per progress; the pick is the
largest log constrained expected improvement over it among feasible candidates not more
than ``explore_slack`` dearer at the 90th percentile of their posterior (safe, cost-aware
exploration), and no exploration unless it is worth ``min_improvement``. The first epoch
runs the prior's best feasible candidate. Changing the worker kind, memory or λ costs
cold containers (a GPU's start-up, which the objective spreads over the epochs left), so
a switch must also promise ``switch_gain``. When nothing is likely on time this epoch,
:meth:`Decider._fallback` picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from configurator.acquisition import log_constrained_ei
from configurator.base import Decision, Observation
from configurator.conformal import Z95
from configurator.gp_settings import GpOptSettings
from configurator.scoring import Scored
from configurator.slowdowns import Z90
from configurator.space import Candidates, EpochConfig

#: Epochs over which a fallback weighs a switch's late epoch against a stay's risk.
FALLBACK_HORIZON = 5
#: Log-latency within which the fallback deems two rows equally late (2 %).
LATENESS_TIE = 0.02


class Decider:
    """Picks a row of a job's scored candidates.

    Parameters
    ----------
    grid
        The candidates the scored rows index.
    settings
        :class:`~configurator.gp_settings.GpOptSettings`.
    """

    def __init__(self, grid: Candidates, settings: GpOptSettings) -> None:
        self._grid = grid
        self.settings = settings

    def decide(
        self, scored: Scored, history: Sequence[Observation], epoch: int, left: int
    ) -> tuple[int, str, int]:
        """Index into ``scored`` of the pick at ``epoch`` (one of ``left``), why, and how
        many candidates competed."""
        settings = self.settings
        safe = np.flatnonzero(scored.p_feasible >= settings.confidence)
        if not len(safe):
            current = history[-1].config if history else None
            return self._fallback(scored, left, current)
        incumbent = int(safe[np.argmin(scored.objective[safe])])
        explore = settings.use_gp and epoch > 0
        if not explore:
            return incumbent, "best feasible posterior mean", len(safe)
        # Safe exploration of the objective as of the deadline: a candidate is tried
        # only if it is unlikely to be much dearer per progress than the incumbent, not
        # merely if its mean is close. Progress is the least arithmetic output (a batch
        # size the prior favours can progress a quarter as much), and mean-only
        # closeness let expected improvement pick exactly the most uncertain of those.
        pessimistic = scored.objective[safe] + Z90 * scored.objective_sd[safe]
        bound = scored.objective[incumbent] + math.log1p(settings.explore_slack)
        near = np.union1d(safe[pessimistic <= bound], [incumbent])
        log_p = np.log(np.maximum(scored.p_feasible[near], 1e-300))
        score = (
            log_constrained_ei(
                scored.objective[near],
                scored.objective_sd[near],
                float(scored.objective[incumbent]),
                [],
            )
            + log_p
        )
        pick = int(near[np.argmax(score)])
        reason = "log constrained EI"
        gate = settings.min_improvement
        if gate > 0 and pick != incumbent and score.max() < math.log(gate):
            return incumbent, "best feasible posterior mean: no EI worth exploring", len(near)
        if history:
            pick, reason = self._hysteresis(scored, safe, pick, reason, history[-1].config)
        return pick, reason, len(near)

    def _fallback(
        self, scored: Scored, left: int, current: EpochConfig | None
    ) -> tuple[int, str, int]:
        """The pick when nothing meets this epoch's share with confidence.

        Where a config would once it follows itself, the cheapest such: a switch's cold
        starts make this epoch late, but every later one can be on time. On a tight
        deadline that is the usual case, first epoch included (every container is
        cold); staying instead on whatever is least late now keeps a job late, or
        nearly, for good. The current memory and λ compete too, without a switch's
        late epoch: over the next ``FALLBACK_HORIZON`` epochs (fewer when fewer are
        left), a row that keeps them qualifies if it is expected late no more often
        than a switch is, in its one cold epoch and the chance constraint's share of
        the rest: near the constraint's edge a recalibration moves a config just under
        it and the next just over, and switching away each time costs a cold, late
        epoch. Otherwise the least late at the same confidence, not the likeliest to be
        on time (that favours the wildest).
        """
        confidence = self.settings.confidence
        warm = scored.p_staying >= confidence
        stays = np.zeros(len(warm), dtype=bool)
        horizon = min(left, FALLBACK_HORIZON)
        if current is not None and horizon > 1:
            # Late epochs expected over the horizon: this one, then following itself.
            late = (1 - scored.p_feasible) + (horizon - 1) * (1 - scored.p_staying)
            allowed = 1 + (horizon - 1) * (1 - confidence)  # a switch's late epoch, then ε
            stays = self._grid.keeps(scored.rows, current) & (late <= allowed)
        fit = np.flatnonzero(warm | stays)
        if len(fit):
            pick = int(fit[np.argmin(scored.objective[fit])])
            if stays[pick]:
                return pick, "none likely feasible now: kept memory and λ, nearly on time", len(fit)
            return pick, "none likely feasible now: the cheapest feasible once warm", len(fit)
        upper = scored.lat + Z90 * scored.lat_sd
        # Rows alike in latency (they differ in learning rate or batch size alone) are
        # told apart by what they achieve, not by their order in the grid.
        close = np.flatnonzero(upper <= float(np.min(upper)) + LATENESS_TIE)
        pick = int(close[np.argmin(scored.objective[close])])
        return pick, "none likely feasible: the least late at 90 %", 0

    def _hysteresis(
        self, scored: Scored, safe: np.ndarray, pick: int, reason: str, current: EpochConfig
    ) -> tuple[int, str]:
        """Keep the current memory and λ unless the pick promises ``switch_gain``."""
        if self._grid.keeps(scored.rows[[pick]], current)[0]:
            return pick, reason
        same = safe[self._grid.keeps(scored.rows[safe], current)]
        if not len(same):
            return pick, reason
        stay = int(same[np.argmin(scored.objective[same])])
        gain = math.expm1(float(scored.objective[stay] - scored.objective[pick]))
        if gain < self.settings.switch_gain:
            return stay, f"{reason}; kept memory and λ (predicted gain {gain:.1%})"
        return pick, reason


def record(
    scored: Scored,
    pick: int,
    reason: str,
    considered: int,
    deadline: float,
    candidates: int,
    decision_ms: float,
) -> Decision:
    """The :class:`Decision` a job keeps: the pick's predictions with 90 % intervals."""
    lat, lat_sd = float(scored.lat[pick]), float(scored.lat_sd[pick])
    cost, cost_sd = float(scored.cost[pick]), float(scored.cost_sd[pick])
    z = Z95  # a 90 % two-sided interval
    return Decision(
        candidates=candidates,
        considered=considered or len(scored.rows),
        latency_s=math.exp(lat),
        latency_interval_s=(math.exp(lat - z * lat_sd), math.exp(lat + z * lat_sd)),
        cost_usd=math.exp(cost + cost_sd**2 / 2),
        cost_interval_usd=(math.exp(cost - z * cost_sd), math.exp(cost + z * cost_sd)),
        deadline_s=deadline,
        p_feasible=float(scored.p_feasible[pick]),
        decision_ms=decision_ms,
        reason=reason,
        extra={"scored": len(scored.rows), "latency_widening": scored.widening},
    )
