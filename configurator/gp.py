"""GP-OPT: each epoch's config vector for the lowest cost per progress within the deadline.

SandPiper's (Ali et al.) Algorithm 1 and Eq. 3, made to work per epoch (§IV-B).
:class:`GpOptConfigurator` runs a decision through collaborators with one job each:

1. **Prior.** The analytic epoch model (:mod:`configurator.performance`), recalibrated
   from the newest epoch's λ invocation records, predicts every candidate's latency
   (an order statistic), cost (arithmetic) and loss progress.
2. **Shares.** The epoch's share of what is left of the deadline and budget
   (:mod:`configurator.shares`: a job ahead of schedule spends ``slack_spend`` of the
   time its earlier epochs saved).
3. **Pruning.** :mod:`configurator.pruning` keeps at most ``keep`` candidates worth
   scoring: within the workers' time limit, not infeasible with high probability, not
   ε-dominated.
4. **Posterior.** Residual GPs (:mod:`configurator.residuals`) correct the prior where
   there are observations — this job's and, warm, earlier jobs' — and
   :mod:`configurator.scoring` turns prior and residuals into each kept candidate's
   objective and P(on time), its latency interval widened until it holds the job's own
   epochs (:mod:`configurator.conformal`).
5. **Decision.** :mod:`configurator.decide` picks the feasible incumbent or the largest
   log constrained expected improvement over it among safe candidates, keeps memory and
   λ unless a switch promises ``switch_gain``, and falls back when nothing is likely on
   time this epoch.
6. **Refit off the critical path.** Hyper-parameters are refitted on a growing schedule,
   on a thread while the epoch runs (:mod:`configurator.refit`); ``propose`` only
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

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from configurator.base import Configurator, Decision, JobContext, Observation
from configurator.conformal import (
    CALIBRATION_EPOCHS,
    CALIBRATION_PRIOR_EPOCHS,
    CALIBRATION_WINDOW,
    Z95,
    latency_widening,
)
from configurator.decide import FALLBACK_HORIZON, LATENESS_TIE, Decider, record
from configurator.epoch_model import EpochModel, Prediction, latency_groups
from configurator.gp_settings import GpOptSettings
from configurator.history import History, PastEpoch, PastJob
from configurator.progress import epoch_progress
from configurator.pruning import Pruner
from configurator.pruning import cheapest as _cheapest
from configurator.pruning import undominated as _undominated
from configurator.recalibration import recalibrate
from configurator.refit import Refits
from configurator.residuals import (
    INPUTS,
    OUTPUTS,
    ResidualGps,
    TrainingData,
    context_feature,
    surrogate_inputs,
    training_data,
)
from configurator.scoring import Scored as _Scored
from configurator.scoring import Scorer
from configurator.shares import Shares
from configurator.space import EpochConfig, SearchSpace
from configurator.surrogate import SURROGATES, Surrogate

__all__ = [
    "CALIBRATION_EPOCHS",
    "CALIBRATION_PRIOR_EPOCHS",
    "CALIBRATION_WINDOW",
    "FALLBACK_HORIZON",
    "INPUTS",
    "LATENESS_TIE",
    "OUTPUTS",
    "Z95",
    "GpOptConfigurator",
    "GpOptSettings",
    "_Scored",
    "_cheapest",
    "_undominated",
    "surrogate_inputs",
]


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
        self.settings = settings = settings or GpOptSettings()
        space = space or SearchSpace()
        if context is not None and max(space.workers) > context.max_workers:
            fits = tuple(w for w in space.workers if w <= context.max_workers) or (1,)
            space = replace(space, workers=fits)
        if context is not None and context.kinds is not None:
            space = replace(space, kinds=context.kinds)
        self.space = space
        self.prior = prior or EpochModel.prior()
        self.history = history
        self._grid = space.grid()
        self._bounds = space.bounds()
        self._features = self._grid.features(self._bounds)
        self._latency_groups = latency_groups(self._grid)
        # Refits build their surrogates the same way (the benchmark's scikit-learn GP
        # refitted with gpytorch otherwise).
        self._gps = ResidualGps(
            surrogates or SURROGATES[settings.surrogate],
            self._features,
            history.load() if history is not None else [],
            settings.use_gp,
            self._grid.kind_feature() if space.several_kinds else None,
        )
        self._refits = Refits(
            self._gps, self._observations, settings.refit_growth, settings.background
        )
        self._decider = Decider(self._grid, settings)
        # What plans for a job: none without one (``propose`` answers the default).
        self._budget: Shares | None = None
        self._pruner: Pruner | None = None
        self._scorer: Scorer | None = None
        if context is not None:
            self._budget = Shares(context, settings.slack_spend)
            limits = self.prior.time_limits(self._grid, context.timeout_s)
            self._pruner = Pruner(self._grid, limits, settings, self._gps.prior_sd)
            self._scorer = Scorer(self._grid, context, self._gps)
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
        self._refits.take()
        context = self.context
        assert context is not None  # propose() answers the default without one
        samples = history[-1].samples if history and history[-1].samples else None
        samples = samples or context.train_samples
        model = self.prior
        if self.settings.calibrate and history:
            model = recalibrate(self.prior, history, context)
        self._model = model
        if self._gps.applies(history):
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
        decision_ms = (time.perf_counter() - started) * 1000
        decision = record(scored, pick, reason, considered, deadline, len(self._grid), decision_ms)
        self.last_decision = decision
        self.decisions.append(decision)
        self._last_history = list(history)
        self._refits.schedule(history, model)
        return config

    # Each step of a decision, by its collaborator (tests and benchmarks call them).
    def _shares(self, epoch: int, history: Sequence[Observation]) -> tuple[float, float]:
        """This epoch's ``(deadline, budget)`` share (:class:`Shares`)."""
        assert self._budget is not None
        return self._budget.of(epoch, history)

    def _prune(
        self,
        now: Prediction,
        steady: Prediction,
        deadline: float,
        current: EpochConfig | None = None,
    ) -> np.ndarray:
        """Grid rows worth scoring (:meth:`Pruner.prune`), a GPU container's start-up
        planned into the job where the space holds other kinds."""
        assert self._pruner is not None
        planned = None
        if self.space.several_kinds:
            planned = self._model.planned_startup_s(self._grid, current)
        return self._pruner.prune(now, steady, deadline, current, planned)

    def _keeps(self, rows: np.ndarray, current: EpochConfig) -> np.ndarray:
        """Per row, whether it keeps ``current``'s memory and λ."""
        return self._grid.keeps(rows, current)

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
        """Posterior of the kept ``rows`` (:meth:`Scorer.score`) under the current
        model, the latency widened by the job's own errors so far."""
        assert self._scorer is not None and self._budget is not None
        left = self._budget.epochs_left(epoch)
        widen = latency_widening(self.decisions, history)
        return self._scorer.score(
            rows, now, steady, history, samples, left, deadline, budget, self._model, widen
        )

    def _decide(
        self, scored: _Scored, history: Sequence[Observation], epoch: int
    ) -> tuple[int, str, int]:
        """Index into ``scored`` of the pick, why, and how many candidates competed."""
        assert self._budget is not None
        return self._decider.decide(scored, history, epoch, self._budget.epochs_left(epoch))

    def _observations(self, history: Sequence[Observation], model: EpochModel) -> TrainingData:
        """The residual GPs' inputs and targets: this job's epochs and earlier jobs'."""
        assert self.context is not None
        return training_data(
            history, model, self.context, self._gps.past, self._bounds, self.space.several_kinds
        )

    def _condition(self, history: Sequence[Observation], model: EpochModel, optimise: bool) -> None:
        self._gps.condition(self._observations(history, model), optimise)

    @staticmethod
    def _context_feature(samples: int) -> float:
        return context_feature(samples)

    @property
    def _surrogates(self) -> dict[str, Surrogate]:
        return self._gps.surrogates

    @property
    def _past(self) -> Sequence[PastJob]:
        return self._gps.past

    # -- across jobs ----------------------------------------------------------------------
    def close(self, history: Sequence[Observation] = ()) -> None:
        """Wait for a refit in flight, then keep this job's epochs for later jobs."""
        self._refits.join()
        history = history or self._last_history
        if self.history is None or self.context is None or not history:
            return
        self.history.save(_past_job(self.context, history, self._gps.states()))


def _past_job(
    context: JobContext, history: Sequence[Observation], hyperparameters: dict[str, Any]
) -> PastJob:
    """What a later job reads of this one: its context, epochs and GPs' hyper-parameters."""
    progress = dict(epoch_progress(history))
    epochs = tuple(
        PastEpoch(
            o.config.as_dict(),
            o.duration_s,
            o.cost_usd,
            progress.get(t),
            o.samples or context.train_samples,
        )
        for t, o in enumerate(history)
    )
    return PastJob(
        context.job_id or f"job-{int(time.time())}",
        context.train_samples,
        context.factors,
        context.model_rows,
        epochs,
        hyperparameters,
    )


_BLAS: Any = None


def _one_blas_thread() -> Any:
    """A context in which numpy's BLAS runs on one thread.

    A decision's linear algebra is many small products (200 x 200 factorisations,
    256-row kernel blocks): a team of BLAS threads spends more on waking and spinning
    than on the arithmetic, and contends with torch's own threads when a refit runs
    beside it (``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``).
    """
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")
