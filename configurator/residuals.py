"""The residual GPs: what they learn from, and the three of them as one collaborator.

The analytic model's errors in log latency, log cost and log progress are modelled by a
GP each (:mod:`configurator.surrogate`), on this job's epochs and, warm, earlier jobs',
each on the inputs its output depends on (``INPUTS``), scored as marginals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeAlias

import numpy as np

from configurator.base import JobContext, Observation
from configurator.epoch_model import EpochModel
from configurator.history import PastJob
from configurator.progress import epoch_progress
from configurator.space import Candidates, EpochConfig
from configurator.surrogate import Surrogate

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
#: Where a space holds several worker kinds, the kind is a seventh column, after the
#: job's size, seen by the outputs a kind changes: its seconds and its bill. The torch
#: and numpy workers compute the same update, so progress does not see it.
KIND_COLUMN = 6
KIND_OUTPUTS = ("latency", "cost")


def surrogate_inputs(output: str, x: np.ndarray) -> np.ndarray:
    """The columns of ``x`` (all six, or seven with the kind) the residual GP of
    ``output`` is given."""
    columns = INPUTS[output]
    if x.shape[1] > KIND_COLUMN and output in KIND_OUTPUTS:
        columns = (*columns, KIND_COLUMN)
    return x[:, columns]


def context_feature(samples: int) -> float:
    """The job's size as the surrogates' last input (the window, on a log scale)."""
    return (math.log10(max(samples, 1)) - 3.0) / 5.0


def input_groups(features: np.ndarray, output: str, kinds: np.ndarray | None = None) -> np.ndarray:
    """Per grid row, which distinct input of ``output``'s residual GP it has (the
    job's size, the last input, is one per decision and left out; ``kinds``, the rows'
    kind feature where the GPs see it)."""
    columns = [c for c in INPUTS[output] if c < features.shape[1]]
    inputs = features[:, columns]
    if kinds is not None and output in KIND_OUTPUTS:
        inputs = np.column_stack([inputs, kinds])
    _, group = np.unique(inputs, axis=0, return_inverse=True)
    return np.asarray(group).ravel()


#: Inputs of every epoch (all six columns), and per output its residual targets and
#: which epochs have one.
TrainingData: TypeAlias = tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]


def training_data(
    history: Sequence[Observation],
    model: EpochModel,
    context: JobContext,
    past: Sequence[PastJob],
    bounds: np.ndarray,
    kinds: bool = False,
) -> TrainingData:
    """Inputs and residual targets against ``model`` of this job's epochs (``history``)
    and earlier jobs' (``past``); with ``kinds``, each epoch's worker kind as the
    seventh input."""
    epochs: list[tuple[EpochConfig, float, float, float | None, int, EpochConfig | None]] = []
    # Which job each epoch is of (-1: this one) and its index there, for the phase.
    job_of: list[int] = []
    index: list[int] = []
    for j, job in enumerate(past):
        prev: EpochConfig | None = None
        for t, e in enumerate(job.epochs):
            epochs.append((e.epoch_config, e.latency_s, e.cost_usd, e.progress, e.samples, prev))
            job_of.append(j)
            index.append(t)
            prev = e.epoch_config
    job_of.extend([-1] * len(history))
    index.extend(range(len(history)))
    progress = dict(epoch_progress(history))
    for t, obs in enumerate(history):
        samples = obs.samples or context.train_samples
        prev = history[t - 1].config if t else None
        epochs.append((obs.config, obs.duration_s, obs.cost_usd, progress.get(t), samples, prev))
    cands = Candidates.of([e[0] for e in epochs])
    previous = Candidates.of([e[5] or e[0] for e in epochs])
    first = np.array([e[5] is None for e in epochs])
    previous = replace(previous, memory_mb=np.where(first, 0.0, previous.memory_mb))
    sizes = np.array([e[4] for e in epochs], dtype=np.float64)
    pred = model.predict(cands, context, samples=sizes, previous=previous)
    level = model.progress.level
    x = np.column_stack([cands.features(bounds), (np.log10(sizes) - 3.0) / 5.0])
    if kinds:
        x = np.column_stack([x, cands.kind_feature()])
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
    residuals["progress"] = centred_per_past_job(
        residuals["progress"], masks["progress"], np.array(job_of)
    )
    return x, residuals, masks


def centred_per_past_job(residuals: np.ndarray, mask: np.ndarray, job: np.ndarray) -> np.ndarray:
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


class ResidualGps:
    """The three residual GPs of a job, over the rows of its grid.

    Parameters
    ----------
    build
        Builds one surrogate (refits build theirs the same way).
    features
        The grid's inputs (:meth:`Candidates.features`), without the job's size.
    past
        Earlier jobs: their hyper-parameters seed the GPs, their epochs are observations.
    enabled
        False: no residual is modelled (the analytic baselines).
    kinds
        The grid's kind feature (:meth:`Candidates.kind_feature`) where it holds several
        worker kinds; None: one kind, not an input.
    """

    def __init__(
        self,
        build: Callable[[], Surrogate],
        features: np.ndarray,
        past: Sequence[PastJob],
        enabled: bool,
        kinds: np.ndarray | None = None,
    ) -> None:
        self.build = build
        self.surrogates: dict[str, Surrogate] = {name: build() for name in OUTPUTS}
        self.features = features
        self.kinds = kinds
        self.input_groups = {name: input_groups(features, name, kinds) for name in OUTPUTS}
        self.past = past
        self.enabled = enabled
        self._seed_hyperparameters()

    def _seed_hyperparameters(self) -> None:
        """The newest earlier job's hyper-parameters, where one kept them."""
        for job in self.past:
            for name in OUTPUTS:
                state = job.hyperparameters.get(name)
                if state:
                    self.surrogates[name].load_state(state)
            if job.hyperparameters:
                break

    def applies(self, history: Sequence[Observation]) -> bool:
        """Whether residuals are modelled and there is an epoch to learn them from."""
        return self.enabled and bool(history or self.past)

    def condition(self, data: TrainingData, optimise: bool) -> None:
        """Condition each GP on its observed residuals (and refit its hyper-parameters
        when ``optimise``)."""
        x, residuals, masks = data
        for name in OUTPUTS:
            mask = masks[name]
            if mask.any():
                self.surrogates[name].fit(
                    surrogate_inputs(name, x[mask]), residuals[name][mask], optimise=optimise
                )

    def shifts(
        self, rows: np.ndarray, samples: int
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per output, the posterior mean and variance of the residual of grid ``rows``
        for a window of ``samples``. Rows that differ only in what an output's GP does
        not see share its prediction: each distinct input is predicted once."""
        x = np.column_stack(
            [self.features[rows], np.full((len(rows), 1), context_feature(samples))]
        )
        if self.kinds is not None:
            x = np.column_stack([x, self.kinds[rows]])
        means, variances = {}, {}
        for name in OUTPUTS:
            _, first, group = np.unique(
                self.input_groups[name][rows], return_index=True, return_inverse=True
            )
            mean, var = self.surrogates[name].predict(surrogate_inputs(name, x[first]))
            means[name], variances[name] = mean[group.ravel()], var[group.ravel()]
        return means, variances

    def prior_sd(self, output: str) -> float:
        """How far the residual GP of ``output`` could move a prediction (its prior sd)."""
        if not self.enabled:
            return 0.0
        state = self.surrogates[output].state()
        scale = state.get("outputscale") if state else None
        return math.sqrt(scale) if scale else 0.5

    def refitted(self, data: TrainingData) -> dict[str, dict[str, Any]]:
        """Hyper-parameters refitted to ``data`` on fresh surrogates (started from the
        current ones), leaving the GPs in use as they are."""
        x, residuals, masks = data
        fresh: dict[str, Surrogate] = {}
        for name in OUTPUTS:
            surrogate = self.build()
            surrogate.load_state(self.surrogates[name].state())
            if masks[name].any():
                inputs = surrogate_inputs(name, x[masks[name]])
                surrogate.fit(inputs, residuals[name][masks[name]], optimise=True)
            fresh[name] = surrogate
        return {name: s.state() for name, s in fresh.items()}

    def load(self, states: dict[str, dict[str, Any]]) -> None:
        """Adopt hyper-parameters per output (a refit's, an earlier job's)."""
        for name, state in states.items():
            self.surrogates[name].load_state(state)

    def states(self) -> dict[str, dict[str, Any]]:
        """Every GP's hyper-parameters, to keep for later jobs."""
        return {name: s.state() for name, s in self.surrogates.items()}
