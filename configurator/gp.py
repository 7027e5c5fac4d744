"""GP-OPT: each epoch's config vector for the lowest cost per progress within the deadline.

SandPiper's (Ali et al.) Algorithm 1 and Eq. 3, made to work per epoch (§IV-B):

1. **Prior.** The analytic epoch model (:mod:`configurator.performance`), recalibrated
   from the newest epoch's λ invocation records, predicts every candidate's latency
   (an order statistic), cost (arithmetic) and loss progress.
2. **Pruning.** Candidates past the workers' time limit, those the prior deems
   infeasible with high probability even allowing for its own error, and those
   ε-dominated in latency and cost per progress (CE-scaling's Pareto boundary, widened
   by what the residual GPs could still change) are dropped; at most ``keep`` remain.
3. **Posterior.** Residual GPs (:mod:`configurator.surrogate`) correct the prior where
   there are observations — this job's and, warm, earlier jobs' — scored as marginals,
   each on the inputs its output depends on (``INPUTS``).
4. **Decision.** Feasible means ``P(latency ≤ the epoch's share of what is left of
   LATENCY_CAP_SECONDS) ≥ confidence`` and the same for the budget (``slack_spend``: the
   share of the time its earlier epochs saved that a job ahead of schedule spends). The
   incumbent is the feasible candidate with the best posterior-mean cost per progress;
   the pick is the largest log constrained expected improvement over it among feasible
   candidates not more than ``explore_slack`` dearer at the 90th percentile of their
   posterior (safe, cost-aware exploration). P(on time) is the lower of the latency
   posterior's (a log-normal) and the order statistic's own under the model's slowdown
   mixture, which sees the cliff stragglers put past its 90th percentile. Once a few
   epochs ran, the latency posterior is widened until it holds the job's own epochs
   (split-conformal). The first epoch is the prior's best feasible candidate. When
   nothing is likely on time this epoch (a switch's cold starts, every container in
   the first epoch), the pick is the cheapest candidate likely on time once warm, at
   the share its own late epoch leaves to the others, or the current memory and λ
   where they are nearly on time (a switch's late epoch would cost more). Changing
   memory or λ costs cold containers: the prior charges them to the epoch that
   switches (amortised over the epochs left in the objective), and a switch must also
   promise ``switch_gain``.
5. **Refit off the critical path.** Hyper-parameters are refitted on a thread while the
   epoch runs (on a growing schedule: 1, 2, 3, 5, 8, ... points); ``propose`` only
   conditions the GPs on the newest epoch and ranks.

Every decision is kept in ``last_decision`` (candidates, predictions with intervals,
decision time), which the job records. Why the surrogate, margins and decision path
are as they are: ``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``.

References
----------
SandPiper (Ali et al.), §IV-B, Algorithm 1, Eq. 3; CE-scaling, §III-B;
O. Alipourfard et al., "CherryPick: adaptively unearthing the best cloud configurations
for big data analytics", NSDI 2017; F. Berkenkamp et al., "Safe model-based reinforcement
learning with stability guarantees" (safe sets); S. Ament et al., NeurIPS 2023 (log EI).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.special import ndtr, ndtri

from configurator.acquisition import log_constrained_ei
from configurator.base import Configurator, Decision, JobContext, Observation
from configurator.history import History, PastEpoch, PastJob
from configurator.performance import (
    Z90,
    EpochModel,
    Prediction,
    epoch_progress,
    latency_groups,
    recalibrate,
)
from configurator.space import Candidates, EpochConfig, SearchSpace
from configurator.surrogate import SURROGATES, Surrogate

log = logging.getLogger(__name__)

#: The three residuals modelled: log latency, log cost, log progress.
OUTPUTS = ("latency", "cost", "progress")
#: The columns each output's residual GP sees, of :meth:`Candidates.features` and then
#: the job's size: memory 0, λ 1, κ/λ 2, batch size 3, learning rate 4, window 5. The
#: learning rate changes no second and no cent of an epoch, and memory buys seconds,
#: not updates: the workers of a config compute the same updates at any memory, and
#: which of them arrive after κ depends on their slowdowns, not on a memory all of them
#: share. Without those inputs each GP learns from epochs that differ in them as
#: repeats of one config, needs a lengthscale fewer, and scores each kept row once per
#: distinct value of its own inputs.
INPUTS: dict[str, tuple[int, ...]] = {
    "latency": (0, 1, 2, 3, 5),
    "cost": (0, 1, 2, 3, 5),
    "progress": (1, 2, 3, 4, 5),
}


def surrogate_inputs(output: str, x: np.ndarray) -> np.ndarray:
    """The columns of ``x`` (all six) the residual GP of ``output`` is given."""
    return x[:, INPUTS[output]]


#: Epochs decided before the latency interval is widened by the job's own errors, and
#: how many recent ones it looks at.
CALIBRATION_EPOCHS = 5
CALIBRATION_WINDOW = 20
#: Epochs' worth of the model's own interval (a widening of 1) the job's errors are
#: pooled with. The 90th percentile of five errors is nearly their largest: one
#: straggler among a job's first epochs widened every later one 2-3 times, nothing was
#: likely on time any more, and the job fell back to its fastest, dearest configs.
CALIBRATION_PRIOR_EPOCHS = 10
#: Epochs over which a fallback weighs a switch's late epoch against a stay's risk.
FALLBACK_HORIZON = 5
#: Log-latency within which the fallback deems two rows equally late (2 %).
LATENESS_TIE = 0.02
#: z of a two-sided 90 % interval (its upper end is the 95th percentile).
Z95 = 1.6448536269514722


@dataclass(frozen=True)
class GpOptSettings:
    """How GP-OPT decides.

    Parameters
    ----------
    confidence
        Probability with which the epoch must meet its deadline share (and budget).
    explore_slack
        Explore only candidates whose cost per progress, at the 90th percentile of its
        posterior, is at most this much above the incumbent's mean (0.25: 25 % dearer).
    switch_gain
        Least predicted relative gain for which memory or λ change.
    keep
        Most candidates left after pruning (scored by the GPs).
    use_gp, calibrate
        Switch off the residual GPs, or the analytic model's recalibration: the
        benchmark's ``analytic_calibrated`` and ``analytic`` baselines.
    surrogate
        A name in ``SURROGATES``.
    background
        Refit hyper-parameters on a thread (the service); False refits in line after the
        decision (reproducible: benchmarks and tests).
    refit_growth
        Refit when the distinct observations have grown by this factor since the last
        refit.
    min_improvement
        Least expected improvement (a share of the incumbent's cost per progress,
        feasibility-weighted) for which an epoch explores; below it the epoch runs the
        incumbent, as CherryPick (NSDI'17) stops searching once EI falls under 10 %.
    slack_spend
        Share of the time earlier epochs saved against their nominal share
        (``LATENCY_CAP_SECONDS / max_epochs``) that an epoch may plan to spend; a job
        behind its schedule plans at its share of what is left whatever this is. An
        epoch on time under the chance constraint usually saves time, and spending all
        of it sets the next epochs at the edge of a share that has grown: under a 0.9
        constraint about one in ten of them runs late, though the job as a whole meets
        its deadline. Less than 1 keeps the rest in reserve (for a window that jumps, a
        run of stragglers) at some cost in regret.

    How ``min_improvement`` and ``slack_spend`` were sized:
    ``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``.
    """

    confidence: float = 0.9
    explore_slack: float = 0.25
    switch_gain: float = 0.03
    keep: int = 2000
    use_gp: bool = True
    calibrate: bool = True
    surrogate: str = "gpytorch"
    background: bool = True
    refit_growth: float = 1.5
    min_improvement: float = 0.1
    slack_spend: float = 0.4

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.explore_slack < 0 or self.switch_gain < 0:
            raise ValueError("explore_slack and switch_gain must not be negative")
        if self.keep < 1:
            raise ValueError(f"keep must be at least 1, got {self.keep}")
        if not 0 <= self.min_improvement < 1:
            raise ValueError(f"min_improvement must be in [0, 1), got {self.min_improvement}")
        if not 0 <= self.slack_spend <= 1:
            raise ValueError(f"slack_spend must be in [0, 1], got {self.slack_spend}")
        if self.refit_growth <= 1:
            raise ValueError(f"refit_growth must exceed 1, got {self.refit_growth}")
        if self.surrogate not in SURROGATES:
            raise ValueError(
                f"unknown surrogate {self.surrogate!r}; choose from {sorted(SURROGATES)}"
            )


@dataclass(frozen=True)
class _Scored:
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
    #: The factor latency spreads were widened by (``GpOptConfigurator._latency_widening``).
    widening: float


class GpOptConfigurator(Configurator):
    """SandPiper's GP-OPT; see the module docstring.

    Parameters
    ----------
    default
        The job's default config vector: the fallback when no context is given.
    context
        What the job is (window size, deadline, budget); without it the configurator
        proposes ``default`` (a job that never said what it is).
    settings
        :class:`GpOptSettings`.
    space
        The candidates (:class:`SearchSpace`).
    prior
        The uncalibrated analytic model (the sim runtime's ``DEFAULT_MODEL``).
    history
        Earlier jobs' observations (warm start), and where this job's are kept.
    surrogates
        Builds a surrogate per output; defaults to ``SURROGATES[settings.surrogate]``.
    """

    def __init__(
        self,
        default: EpochConfig,
        context: JobContext | None = None,
        settings: GpOptSettings | None = None,
        space: SearchSpace | None = None,
        prior: EpochModel | None = None,
        history: History | None = None,
        surrogates: Callable[[], Surrogate] | None = None,
    ) -> None:
        self.default = default
        self.context = context
        self.settings = settings or GpOptSettings()
        space = space or SearchSpace()
        if context is not None and max(space.workers) > context.max_workers:
            fits = tuple(w for w in space.workers if w <= context.max_workers) or (1,)
            space = replace(space, workers=fits)
        self.space = space
        self.prior = prior or EpochModel.prior()
        self.history = history
        build = surrogates or SURROGATES[self.settings.surrogate]
        # Refits build their surrogates the same way (the benchmark's scikit-learn GP
        # refitted with gpytorch otherwise).
        self._build = build
        self._surrogates: dict[str, Surrogate] = {name: build() for name in OUTPUTS}
        self._grid = self.space.grid()
        self._bounds = self.space.bounds()
        self._features = self._grid.features(self._bounds)
        self._latency_groups = latency_groups(self._grid)
        self._input_groups = {name: _input_groups(self._features, name) for name in OUTPUTS}
        self._past = history.load() if history is not None else []
        self._seed_hyperparameters()
        self._refit_at = 1
        self._fit_thread: threading.Thread | None = None
        self._pending_state: dict[str, dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self._model = self.prior
        self._last_history: Sequence[Observation] = ()
        self.last_decision: Decision | None = None
        self.decisions: list[Decision] = []

    # -- the decision ---------------------------------------------------------------------
    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        if self.context is None:
            return self.default
        with _one_blas_thread():
            return self._propose(epoch, history)

    def _propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        started = time.perf_counter()
        self._take_refit()
        context = self.context
        assert context is not None  # propose() answers the default without one
        samples = history[-1].samples if history and history[-1].samples else None
        samples = samples or context.train_samples
        model = self.prior
        if self.settings.calibrate and history:
            model = recalibrate(self.prior, history, context)
        self._model = model
        if self.settings.use_gp and (history or self._past):
            self._condition(history, model, optimise=False)
        previous = history[-1].config if history else None
        deadline, budget = self._shares(epoch, history)
        # Each row following itself, then after the current config.
        steady, now = model.predict_after(
            self._grid,
            context,
            (self._grid, previous),
            samples=samples,
            same_latency=self._latency_groups,
        )
        rows = self._prune(now, steady, deadline, previous)
        scored = self._score(rows, now, steady, history, samples, epoch, deadline, budget)
        pick, reason, considered = self._decide(scored, history, epoch)
        config = self._grid.config(int(scored.rows[pick]))
        decision = self._decision(scored, pick, reason, considered, deadline, started)
        self.last_decision = decision
        self.decisions.append(decision)
        self._last_history = list(history)
        self._schedule_refit(history, model)
        return config

    def _epochs_left(self, epoch: int) -> int:
        """Epochs the job has left, this one included (at least one: a job may overrun
        ``max_epochs``)."""
        assert self.context is not None  # propose() answers the default without one
        return max(1, self.context.max_epochs - epoch)

    def _shares(self, epoch: int, history: Sequence[Observation]) -> tuple[float, float]:
        """This epoch's share of the time and money left: what is left over the epochs
        left (a job may stop early, so this errs on the safe side), of which a job ahead
        of its schedule spends ``slack_spend`` of what it saved."""
        context = self.context
        assert context is not None
        left = self._epochs_left(epoch)
        elapsed = sum(o.duration_s for o in history)
        deadline = max(context.latency_cap_s - elapsed, 1e-3) / left
        nominal = context.latency_cap_s / context.max_epochs
        if deadline > nominal and self.settings.slack_spend < 1:
            deadline = nominal + self.settings.slack_spend * (deadline - nominal)
        spent = sum(o.cost_usd for o in history)
        budget = math.inf
        if context.budget_usd is not None:
            budget = max(context.budget_usd - spent, 1e-12) / left
        return deadline, budget

    def _prune(
        self,
        now: Prediction,
        steady: Prediction,
        deadline: float,
        current: EpochConfig | None = None,
    ) -> np.ndarray:
        """Rows worth scoring, at most ``keep``: the cheapest rows the prior alone deems
        likely on time (a quarter of the places for rows on time even after a switch, a
        quarter for rows on time once warm, ``_fallback``'s when no row is on time now,
        and a quarter for rows that keep the current memory and λ, which it weighs too),
        then the cheapest of the rest that are within the time limit, not infeasible
        with high probability and not ε-dominated.

        The cheapest rows are the slowest: cut by cost alone, the kept ones can all be
        unlikely on time while thousands of dearer ones would be; and dominance judged
        on this epoch's latency drops rows that are on time only once warm.
        """
        assert self.context is not None
        within_limit = now.worker_tail_s < self.context.timeout_s
        objective = steady.log_cost - steady.log_progress
        quarter = max(1, self.settings.keep // 4)
        on_time = self._likely_on_time(now, steady, deadline) & within_limit
        once_warm = self._likely_on_time(steady, steady, deadline) & within_limit & ~on_time
        staying = np.zeros(len(on_time), dtype=bool)
        if current is not None:
            staying = self._keeps(np.arange(len(on_time)), current) & within_limit
            staying &= ~on_time & ~once_warm
        sure = np.concatenate(
            [
                _cheapest(objective, np.flatnonzero(on_time), quarter),
                _cheapest(objective, np.flatnonzero(once_warm), quarter),
                _cheapest(objective, np.flatnonzero(staying), quarter),
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
        rows = rows[_undominated(now.log_latency[rows], objective[rows], epistemic, eps)]
        return np.concatenate([sure, _cheapest(objective, rows, room)])

    def _likely_on_time(self, now: Prediction, steady: Prediction, deadline: float) -> np.ndarray:
        """Per row, whether the prior alone gives it ``confidence`` of meeting
        ``deadline`` this epoch and when it follows itself."""
        later = now.log_latency >= steady.log_latency
        latency = np.where(later, now.log_latency, steady.log_latency)
        sd = np.where(later, now.log_latency_sd, steady.log_latency_sd)
        return math.log(deadline) - latency >= ndtri(self.settings.confidence) * sd

    def _prior_sd(self, output: str) -> float:
        """How far the residual GP of ``output`` could move a prediction (its prior sd)."""
        if not self.settings.use_gp:
            return 0.0
        state = self._surrogates[output].state()
        scale = state.get("outputscale") if state else None
        return math.sqrt(scale) if scale else 0.5

    def _score(
        self,
        rows: np.ndarray,
        now: Prediction,
        steady: Prediction,
        history: Sequence[Observation],
        samples: int,
        epoch: int,
        deadline: float,
        budget: float,
    ) -> _Scored:
        """Posterior of the kept rows: prior plus residual GP, objective amortising this
        epoch's switching cost over the epochs left."""
        assert self.context is not None
        lat, lat_sd = now.log_latency[rows], now.log_latency_sd[rows]
        cost, cost_sd = now.log_cost[rows], now.log_cost_sd[rows]
        steady_cost, progress = steady.log_cost[rows], steady.log_progress[rows]
        steady_lat, steady_lat_sd = steady.log_latency[rows], steady.log_latency_sd[rows]
        progress_sd = steady.log_progress_sd[rows]
        epi = {name: np.zeros(len(rows)) for name in OUTPUTS}
        if self.settings.use_gp and (history or self._past):
            x = np.column_stack(
                [self._features[rows], np.full((len(rows), 1), self._context_feature(samples))]
            )
            shifts = {}
            for name in OUTPUTS:
                # Rows that differ only in what the output's GP does not see share its
                # prediction: each distinct input is predicted once.
                _, first, group = np.unique(
                    self._input_groups[name][rows], return_index=True, return_inverse=True
                )
                mean, var = self._surrogates[name].predict(surrogate_inputs(name, x[first]))
                shifts[name], epi[name] = mean[group.ravel()], var[group.ravel()]
            lat, cost = lat + shifts["latency"], cost + shifts["cost"]
            steady_lat = steady_lat + shifts["latency"]
            steady_cost = steady_cost + shifts["cost"]
            progress = progress + shifts["progress"]
        left = self._epochs_left(epoch)
        switching = np.log1p(np.maximum(np.exp(cost - steady_cost) - 1.0, 0.0) / left)
        objective = steady_cost + switching - progress
        objective_sd = np.sqrt(epi["cost"] + epi["progress"])
        widen = self._latency_widening(history)
        total_lat_sd = widen * np.sqrt(lat_sd**2 + epi["latency"])
        total_cost_sd = np.sqrt(cost_sd**2 + epi["cost"])
        tail_now, tail_steady = self._tail_scores(
            rows, history, samples, deadline, lat - now.log_latency[rows]
        )
        p = _on_time(math.log(deadline), lat, lat_sd, total_lat_sd, tail_now)
        # A pick must also be one the job can stay on: an epoch that meets its share only
        # because the last one left every container warm (a small λ after a large one)
        # runs late as soon as it follows itself, and a late epoch shrinks every later
        # epoch's share.
        steady_sd = widen * np.sqrt(steady_lat_sd**2 + epi["latency"])
        staying = _on_time(math.log(deadline), steady_lat, steady_lat_sd, steady_sd, tail_steady)
        p = np.minimum(p, staying)
        # What a fallback that switches plans on: the config following itself at the
        # share the later epochs get once this one has run (its 90th percentile), not
        # at this one's: a switch planned late shrinks every later share, and a config
        # at the boundary of this share would be out of reach the next epoch.
        after = _share_after(deadline, left, lat + Z90 * total_lat_sd)
        staying = ndtr((np.log(after) - steady_lat) / steady_sd)
        if math.isfinite(budget):
            within = ndtr((math.log(budget) - cost) / total_cost_sd)
            p, staying = p * within, staying * within
        del progress_sd
        return _Scored(
            rows, lat, total_lat_sd, cost, total_cost_sd, objective, objective_sd, p, staying, widen
        )

    def _tail_scores(
        self,
        rows: np.ndarray,
        history: Sequence[Observation],
        samples: int,
        deadline: float,
        shift: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The order statistic's own P(on time) of ``rows`` as normal scores, this epoch
        and following itself (:meth:`EpochModel.on_time_scores`), the residual GP's
        ``shift`` of log latency taken off the deadline: where the straggler tail is a
        cliff past the 90th percentile, the log-normal's score is too high."""
        assert self.context is not None
        cands = self._grid.take(rows)
        previous = history[-1].config if history else None
        now, steady = self._model.on_time_scores(
            cands, self.context, (previous, cands), math.log(deadline) - shift, samples=samples
        )
        return now, steady

    def _latency_widening(self, history: Sequence[Observation]) -> float:
        """How much wider the latency posterior must be to hold this job's own epochs:
        the 90th percentile of their standardised errors over the normal's, at least 1,
        once ``CALIBRATION_EPOCHS`` epochs were decided here (a split-conformal
        correction of the interval), pooled with ``CALIBRATION_PRIOR_EPOCHS`` epochs'
        worth of the model's own percentile so that a few errors move it by little.

        The analytic order statistic is exact only for the slowdowns it assumes; until
        a job's records show the fleet's tail (a job of one or two workers an epoch
        shows it slowly), its intervals are too narrow, and a pick at the edge of the
        chance constraint runs late more often than one epoch in ten.
        """
        # The decision of epoch t is the t-th of those made for this job's epochs.
        decided = self.decisions[-len(history) :] if history else []
        pairs = list(zip(decided, history[-len(decided) :], strict=True)) if decided else []
        errors = []
        for decision, observed in pairs[-CALIBRATION_WINDOW:]:
            sd = math.log(max(decision.latency_interval_s[1], 1e-12) / decision.latency_s) / Z95
            sd /= decision.extra.get("latency_widening", 1.0)  # the model's own spread
            if sd > 0 and observed.duration_s > 0:
                errors.append(math.log(observed.duration_s / decision.latency_s) / sd)
        if len(errors) < CALIBRATION_EPOCHS:
            return 1.0
        n, prior = len(errors), CALIBRATION_PRIOR_EPOCHS
        quantile = (n * float(np.quantile(errors, 0.9)) + prior * Z90) / (n + prior)
        return max(1.0, quantile / Z90)

    def _decide(
        self, scored: _Scored, history: Sequence[Observation], epoch: int
    ) -> tuple[int, str, int]:
        """Index into ``scored`` of the pick, why, and how many candidates competed."""
        settings = self.settings
        safe = np.flatnonzero(scored.p_feasible >= settings.confidence)
        if not len(safe):
            current = history[-1].config if history else None
            return self._fallback(scored, self._epochs_left(epoch), current)
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
        self, scored: _Scored, left: int, current: EpochConfig | None
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
        the rest. Near the constraint's edge a recalibration moves a config just under
        it and the next just over; switching away each time cost a cold, late epoch,
        and on tight deadlines jobs alternated so for their first ten epochs, half of
        them late. Otherwise the least late at the same confidence, not the likeliest
        to be on time (that favours the wildest).
        """
        confidence = self.settings.confidence
        warm = scored.p_staying >= confidence
        stays = np.zeros(len(warm), dtype=bool)
        horizon = min(left, FALLBACK_HORIZON)
        if current is not None and horizon > 1:
            # Late epochs expected over the horizon: this one, then following itself.
            late = (1 - scored.p_feasible) + (horizon - 1) * (1 - scored.p_staying)
            allowed = 1 + (horizon - 1) * (1 - confidence)  # a switch's late epoch, then ε
            stays = self._keeps(scored.rows, current) & (late <= allowed)
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

    def _keeps(self, rows: np.ndarray, current: EpochConfig) -> np.ndarray:
        """Per row, whether it keeps ``current``'s memory and λ (no container to start)."""
        grid = self._grid
        return (grid.memory_mb[rows] == current.memory_mb) & (grid.workers[rows] == current.workers)

    def _hysteresis(
        self, scored: _Scored, safe: np.ndarray, pick: int, reason: str, current: EpochConfig
    ) -> tuple[int, str]:
        """Keep the current memory and λ unless the pick promises ``switch_gain``."""
        if self._keeps(scored.rows[[pick]], current)[0]:
            return pick, reason
        same = safe[self._keeps(scored.rows[safe], current)]
        if not len(same):
            return pick, reason
        stay = int(same[np.argmin(scored.objective[same])])
        gain = math.expm1(float(scored.objective[stay] - scored.objective[pick]))
        if gain < self.settings.switch_gain:
            return stay, f"{reason}; kept memory and λ (predicted gain {gain:.1%})"
        return pick, reason

    def _decision(
        self,
        scored: _Scored,
        pick: int,
        reason: str,
        considered: int,
        deadline: float,
        started: float,
    ) -> Decision:
        lat, lat_sd = float(scored.lat[pick]), float(scored.lat_sd[pick])
        cost, cost_sd = float(scored.cost[pick]), float(scored.cost_sd[pick])
        z = Z95  # a 90 % two-sided interval
        return Decision(
            candidates=len(self._grid),
            considered=considered or len(scored.rows),
            latency_s=math.exp(lat),
            latency_interval_s=(math.exp(lat - z * lat_sd), math.exp(lat + z * lat_sd)),
            cost_usd=math.exp(cost + cost_sd**2 / 2),
            cost_interval_usd=(math.exp(cost - z * cost_sd), math.exp(cost + z * cost_sd)),
            deadline_s=deadline,
            p_feasible=float(scored.p_feasible[pick]),
            decision_ms=(time.perf_counter() - started) * 1000,
            reason=reason,
            extra={"scored": len(scored.rows), "latency_widening": scored.widening},
        )

    # -- the surrogates' data -------------------------------------------------------------
    def _context_feature(self, samples: int) -> float:
        return (math.log10(max(samples, 1)) - 3.0) / 5.0

    def _observations(
        self, history: Sequence[Observation], model: EpochModel
    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Inputs and residual targets of this job's epochs and earlier jobs'."""
        assert self.context is not None
        epochs: list[tuple[EpochConfig, float, float, float | None, int, EpochConfig | None]] = []
        # Which job each epoch is of (-1: this one) and its index there, for the phase.
        job_of: list[int] = []
        index: list[int] = []
        for j, job in enumerate(self._past):
            prev: EpochConfig | None = None
            for t, e in enumerate(job.epochs):
                epochs.append(
                    (e.epoch_config, e.latency_s, e.cost_usd, e.progress, e.samples, prev)
                )
                job_of.append(j)
                index.append(t)
                prev = e.epoch_config
        job_of.extend([-1] * len(history))
        index.extend(range(len(history)))
        progress = dict(epoch_progress(history))
        for t, obs in enumerate(history):
            samples = obs.samples or self.context.train_samples
            prev = history[t - 1].config if t else None
            epochs.append(
                (obs.config, obs.duration_s, obs.cost_usd, progress.get(t), samples, prev)
            )
        cands = Candidates.of([e[0] for e in epochs])
        previous = Candidates.of([e[5] or e[0] for e in epochs])
        first = np.array([e[5] is None for e in epochs])
        previous = replace(previous, memory_mb=np.where(first, 0.0, previous.memory_mb))
        sizes = np.array([e[4] for e in epochs], dtype=np.float64)
        pred = model.predict(cands, self.context, samples=sizes, previous=previous)
        level = model.progress.level
        x = np.column_stack([cands.features(self._bounds), (np.log10(sizes) - 3.0) / 5.0])
        observed = {
            "latency": np.log(np.maximum([e[1] for e in epochs], 1e-9)),
            "cost": np.log(np.maximum([e[2] for e in epochs], 1e-15)),
            "progress": np.log(
                np.maximum([e[3] if e[3] is not None else np.nan for e in epochs], 1e-3 * level)
            ),
        }
        predicted = {
            "latency": pred.log_latency,
            "cost": pred.log_cost,
            "progress": pred.log_progress + model.progress.phase_log(np.array(index), len(history)),
        }
        masks = {name: np.isfinite(observed[name]) for name in OUTPUTS}
        masks["cost"] &= np.array([e[2] > 0 for e in epochs])
        residuals = {name: observed[name] - predicted[name] for name in OUTPUTS}
        residuals["progress"] = _centred_per_past_job(
            residuals["progress"], masks["progress"], np.array(job_of)
        )
        return x, residuals, masks

    def _condition(self, history: Sequence[Observation], model: EpochModel, optimise: bool) -> None:
        x, residuals, masks = self._observations(history, model)
        for name in OUTPUTS:
            mask = masks[name]
            if mask.any():
                self._surrogates[name].fit(
                    surrogate_inputs(name, x[mask]), residuals[name][mask], optimise=optimise
                )

    # -- refitting off the critical path --------------------------------------------------
    def _schedule_refit(self, history: Sequence[Observation], model: EpochModel) -> None:
        """Refit hyper-parameters on the growing schedule, on a thread while the epoch
        runs (``settings.background``) or at once, after the decision was timed."""
        if not self.settings.use_gp or not (history or self._past):
            return
        n = len(history) + sum(len(j.epochs) for j in self._past)
        if n < self._refit_at:
            return
        if self._fit_thread is not None and self._fit_thread.is_alive():
            return  # the next decision goes on with the hyper-parameters it has
        self._refit_at = max(n + 1, math.ceil(n * self.settings.refit_growth))
        if not self.settings.background:
            self._refit(list(history), model)
            self._take_refit()
            return
        thread = threading.Thread(
            target=self._refit, args=(list(history), model), name="gp-opt-refit", daemon=True
        )
        self._fit_thread = thread
        thread.start()

    def _refit(self, history: list[Observation], model: EpochModel) -> None:
        fresh: dict[str, Surrogate] = {}
        try:
            x, residuals, masks = self._observations(history, model)
            for name in OUTPUTS:
                surrogate = self._build()
                surrogate.load_state(self._surrogates[name].state())
                if masks[name].any():
                    inputs = surrogate_inputs(name, x[masks[name]])
                    surrogate.fit(inputs, residuals[name][masks[name]], optimise=True)
                fresh[name] = surrogate
        except Exception:  # the next decision goes on with the hyper-parameters it has
            log.exception("GP-OPT: background refit failed")
            return
        with self._lock:
            self._pending_state = {name: s.state() for name, s in fresh.items()}

    def _take_refit(self) -> None:
        """Adopt the hyper-parameters a finished refit left."""
        with self._lock:
            pending, self._pending_state = self._pending_state, None
        for name, state in (pending or {}).items():
            self._surrogates[name].load_state(state)

    # -- across jobs ----------------------------------------------------------------------
    def _seed_hyperparameters(self) -> None:
        for job in self._past:
            for name in OUTPUTS:
                state = job.hyperparameters.get(name)
                if state:
                    self._surrogates[name].load_state(state)
            if job.hyperparameters:
                break

    def close(self, history: Sequence[Observation] = ()) -> None:
        """Wait for a refit in flight, then keep this job's epochs for later jobs."""
        if self._fit_thread is not None:
            self._fit_thread.join()
        history = history or self._last_history
        if self.history is None or self.context is None or not history:
            return
        progress = dict(epoch_progress(history))
        epochs = tuple(
            PastEpoch(
                o.config.as_dict(),
                o.duration_s,
                o.cost_usd,
                progress.get(t),
                o.samples or self.context.train_samples,
            )
            for t, o in enumerate(history)
        )
        self.history.save(
            PastJob(
                self.context.job_id or f"job-{int(time.time())}",
                self.context.train_samples,
                self.context.factors,
                self.context.model_rows,
                epochs,
                {name: s.state() for name, s in self._surrogates.items()},
            )
        )


_BLAS: Any = None


def _on_time(
    log_deadline: float,
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


def _share_after(deadline: float, left: int, log_latency: np.ndarray) -> np.ndarray:
    """Each later epoch's share of the time left once this epoch (``deadline``, one of
    ``left`` shares) took ``exp(log_latency)``; none when no epoch is left after it."""
    if left <= 1:
        return np.full(len(log_latency), 1e-12)
    return np.maximum((deadline * left - np.exp(log_latency)) / (left - 1), 1e-12)


def _cheapest(objective: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` of ``rows`` (ascending) lowest in ``objective``, in order, ties by row:
    what a stable sort of the whole grid would give, from a partial selection (the
    grid's sort was a tenth of a decision)."""
    if n <= 0:
        return rows[:0]
    values = objective[rows]
    if len(rows) > n:
        kth = np.partition(values, n - 1)[n - 1]
        rows = np.concatenate([rows[values < kth], rows[values == kth]])[:n]
        values = objective[rows]
    return rows[np.lexsort((rows, values))]


def _input_groups(features: np.ndarray, output: str) -> np.ndarray:
    """Per grid row, which distinct input of ``output``'s residual GP it has (the
    job's size, the last input, is one per decision and left out)."""
    columns = [c for c in INPUTS[output] if c < features.shape[1]]
    _, group = np.unique(features[:, columns], axis=0, return_inverse=True)
    return np.asarray(group).ravel()


def _one_blas_thread() -> Any:
    """A context in which numpy's BLAS runs on one thread.

    A decision's linear algebra is many small products (200 x 200 factorisations,
    256-row kernel blocks): a team of BLAS threads spends more on waking and spinning
    than on the arithmetic, and contends with torch's own threads when a refit runs
    beside it: one thread more than halves a decision's time
    (``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``).
    """
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def _centred_per_past_job(residuals: np.ndarray, mask: np.ndarray, job: np.ndarray) -> np.ndarray:
    """Progress residuals with each earlier job's own mean taken out (``job`` -1: this
    job's epochs, left as they are).

    An earlier job's level (its window, how far its loss had fallen) says nothing about
    this one's; what carries over is how configs progress relative to each other.
    """
    out = residuals.copy()
    for j in np.unique(job[job >= 0]):
        rows = (job == j) & mask
        if rows.any():
            out[rows] -= float(np.mean(residuals[rows]))
    return out


def _undominated(
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
