"""Loss progress: how far an epoch of a config vector moves the training loss, and its fit.

An epoch's relative fall of the training loss saturates with the SGD steps a worker
takes, ``1 - exp(-η · ⌈n/(λb)⌉ / τ)``, and the share ``1 - κ/λ`` of updates that arrive
an epoch late counts for less (the coordinator damps a stale update by
``1/(1 + staleness)``, and it was computed against a model the fresh updates moved).
:func:`fit_progress` refits the curve's knee, a late update's worth and the job's phase
(how much less each epoch progresses than the one before) from the job's own epochs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from configurator.base import JobContext, Observation
from configurator.space import Candidates, EpochConfig

#: The prior's knee of an epoch's progress in learning rate × steps per worker. Where
#: SGD's progress stops paying is set by the loss's curvature, not by the window, so the
#: knee is one of ``lr·steps`` whatever the window (one set at the job's default on one
#: window put it far off on another, and made small batches look far better than they
#: are).
PRIOR_KNEE = 1.0


@dataclass(frozen=True)
class ProgressCurve:
    """Relative loss progress of an epoch: ``level · (1 - exp(-η·steps/tau)) · worth``.

    ``steps`` is the SGD steps one worker takes (``⌈⌈n/λ⌉/b⌉``) and ``worth`` is
    ``κ/λ + (1 - κ/λ)·late_credit·exp(-η·steps/tau)``. ``level`` is the next epoch's;
    ``decay`` is the job's phase, by how much each epoch progresses less than the one
    before (progress shrinks as the loss nears its floor); ``tau`` is where the steps
    stop paying; ``late_credit`` is what a straggler's update is worth against a fresh
    one: the coordinator damps it to ½ (one epoch stale), but it was computed against a
    model the fresh updates have moved since, by as much as they progressed, so it is
    worth less the larger the updates (a constant ½ overrates it for large updates and
    underrates it for small ones). What the job's own epochs show refits ``late_credit``.
    """

    level: float = 0.02
    tau: float = PRIOR_KNEE
    decay: float = 1.0
    late_credit: float = 0.5

    def phase_log(self, epochs: np.ndarray, now: int) -> np.ndarray:
        """Log of how much more epoch ``epochs`` progressed than epoch ``now`` will, the
        config aside: what an observation's residual must not count as the config's."""
        return (now - np.asarray(epochs, dtype=np.float64)) * -math.log(self.decay)

    def shape(self, cands: Candidates, samples: int | np.ndarray) -> np.ndarray:
        steps = np.ceil(np.ceil(samples / cands.workers) / cands.batch_size)
        fresh = cands.kappa / cands.workers
        gained = 1.0 - np.exp(-cands.learning_rate * steps / self.tau)
        worth = fresh + (1 - fresh) * self.late_credit * (1.0 - gained)
        return gained * worth


def epoch_progress(history: Sequence[Observation]) -> list[tuple[int, float]]:
    """``(epoch, relative loss progress)`` of every epoch after the first."""
    out = []
    for t in range(1, len(history)):
        before, after = history[t - 1].loss, history[t].loss
        if before > 0 and math.isfinite(before) and math.isfinite(after):
            out.append((t, (before - after) / before))
    return out


#: Candidate knees of the progress curve, relative to the prior's.
_TAU_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: Candidate worths of a straggler's update, the prior's (the coordinator's damping)
#: first so that it stays where the epochs cannot tell them apart.
_LATE_CREDITS = (0.5, 0.0, 0.25, 0.75, 1.0)
#: Recent epochs the progress curve is fitted to (a window that jumped changes its
#: level), epochs needed before the phase's decay is fitted, and the steepest decay
#: believed.
PROGRESS_EPOCHS = 12
DECAY_EPOCHS = 4
MIN_DECAY = 0.5


def fit_progress(
    curve: ProgressCurve, history: Sequence[Observation], context: JobContext
) -> ProgressCurve:
    """``curve`` refitted to the recent progress of ``history``: the knee ``tau`` that
    best explains it (in logs, over a few multiples of the prior's), a late update's
    worth where epochs of two κ/λ can tell, and the job's phase, a level that falls by
    ``decay`` per epoch, fitted with them.

    Without the phase, an epoch of the job's start looks better than the same config
    would do now: the residual GP credits the early configs with what is the phase's,
    and a config that progresses far less than another looks as good once tried early.
    """
    progress = [(t, p) for t, p in epoch_progress(history) if p > 0][-PROGRESS_EPOCHS:]
    if not progress:
        return curve
    samples_at = np.array([history[t].samples or context.train_samples for t, _ in progress])
    configs = [history[t].config for t, _ in progress]
    cands = Candidates.of(configs)
    epochs = np.array([t for t, _ in progress], dtype=np.float64) - len(history)
    repeats = _Repeats.of(epochs, _same_config(configs, samples_at))
    observed = np.log([p for _, p in progress])
    taus = [PRIOR_KNEE * f for f in _TAU_FACTORS] if len(progress) >= 3 else [PRIOR_KNEE]
    credits = [curve.late_credit]
    if len(np.unique(np.round(cands.kappa / cands.workers, 6))) >= 2:
        credits = list(_LATE_CREDITS)  # only epochs of two κ/λ can tell
    best: tuple[float, ProgressCurve] | None = None
    for tau, credit in itertools.product(taus, credits):
        tried = replace(curve, tau=tau, late_credit=credit)
        logs = observed - np.log(np.maximum(tried.shape(cands, samples_at), 1e-12))
        level, slope = _phase_line(epochs, logs, repeats, math.log(curve.decay))
        sse = float(np.sum((logs - level - slope * epochs) ** 2))
        if best is None or sse < best[0] - 1e-12:
            best = (sse, replace(tried, level=math.exp(level), decay=math.exp(slope)))
    assert best is not None
    return best[1]


def _same_config(configs: list[EpochConfig], samples: np.ndarray) -> np.ndarray:
    """A label per epoch, equal for epochs of the same config on the same window."""
    labels: dict[tuple[EpochConfig, float], int] = {}
    return np.array(
        [
            labels.setdefault((c, float(n)), len(labels))
            for c, n in zip(configs, samples, strict=True)
        ]
    )


@dataclass(frozen=True)
class _Repeats:
    """The epochs that ran a config again, and their epochs centred per config: what
    the decay is read from, the same for every curve a fit tries, so found once per
    fit."""

    groups: tuple[np.ndarray, ...]
    centred_epochs: np.ndarray
    spread: float
    #: Whether they are enough to read the decay from: ``DECAY_EPOCHS`` epochs spanning
    #: as many.
    enough: bool

    @classmethod
    def of(cls, epochs: np.ndarray, config: np.ndarray) -> _Repeats:
        centred_epochs = np.zeros(len(epochs))
        repeated = np.zeros(len(epochs), dtype=bool)
        groups = []
        for label in np.unique(config):
            rows = config == label
            if rows.sum() >= 2:
                groups.append(rows)
                repeated |= rows
                centred_epochs[rows] = epochs[rows] - epochs[rows].mean()
        spread = float(np.sum(centred_epochs**2))
        enough = bool(
            repeated.sum() >= DECAY_EPOCHS
            and np.ptp(epochs[repeated]) >= DECAY_EPOCHS - 1
            and spread
        )
        return cls(tuple(groups), centred_epochs, spread, enough)


def _phase_line(
    epochs: np.ndarray, logs: np.ndarray, repeats: _Repeats, slope: float
) -> tuple[float, float]:
    """``(log level at epoch 0, log decay)`` of ``logs`` against ``epochs`` (relative to
    the next epoch).

    The decay is read only from epochs that ran the same config (``repeats``: a
    within-config least squares slope), once ``DECAY_EPOCHS`` such epochs span as many,
    kept between no decay and ``MIN_DECAY``; ``slope`` as given before. Across configs
    the prior's error and the phase cannot be told apart: a switch to a config the prior
    overrates (κ/λ ½ where it progresses half as much) read as a steep phase, its
    residual vanished, and the job stayed on it.
    """
    if repeats.enough:
        centred_logs = np.zeros(len(epochs))
        for rows in repeats.groups:
            centred_logs[rows] = logs[rows] - logs[rows].mean()
        fitted = float(np.sum(repeats.centred_epochs * centred_logs)) / repeats.spread
        slope = min(0.0, max(math.log(MIN_DECAY), fitted))
    return float(np.mean(logs - slope * epochs)), slope


def progress_sd(prior: float, history: Sequence[Observation]) -> float:
    """How much an epoch's progress wanders from one epoch to the next (in logs), once
    there are a few to tell; ``prior`` before."""
    logs = np.log([p for _, p in epoch_progress(history) if p > 0])
    if len(logs) < 4:
        return prior
    return max(float(np.std(np.diff(logs))) / math.sqrt(2), 0.02)
