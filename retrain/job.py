"""Running one retraining job, epoch by epoch, to convergence.

The job owns the loop and the stopping rule; the configurator picks each epoch's config
vector; the backend does the arithmetic. Each finished epoch is reported through
``on_epoch`` so the caller can persist it before the next one starts.

A job whose coordinator crashed continues from its checkpoint: a backend rebuilt by
``retrain.coordinator.DistributedBackend.resume`` already holds the model and the data,
and ``run_training(..., history=backend.epochs, prepare=False)`` carries on the epoch
numbers, the configurator's observations, the cost and the stopping rule from there.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from configurator.base import Configurator, Observation
from configurator.space import EpochConfig
from functions.mf import BiasedMF
from retrain.backends import TrainingBackend
from retrain.convergence import ConvergenceRule, StopReason
from retrain.window import RatingsWindow


@dataclass(frozen=True)
class EpochRecord:
    """One finished epoch as the job record keeps it."""

    epoch: int
    loss: float
    duration_s: float
    config: dict[str, Any]
    cost_usd: float = 0.0
    #: Why the configurator picked ``config``, with what it predicted and what came of
    #: it (searching configurators; see ``configurator.Decision``).
    decision: dict[str, Any] | None = None


@dataclass
class JobResult:
    """The trained model and how it got there."""

    model: BiasedMF
    stop_reason: StopReason
    epochs: list[EpochRecord] = field(default_factory=list)
    holdout_rmse: float | None = None
    train_events: int = 0
    holdout_events: int = 0

    @property
    def cost_usd(self) -> float:
        return sum(e.cost_usd for e in self.epochs)


def starting_model(base: BiasedMF | None, template: BiasedMF, window: RatingsWindow) -> BiasedMF:
    """A warm start from the serving model when there is one, else a fresh model.

    Warm starts keep what the model knows about users and items absent from the window,
    which is what continual learning is for; they also converge in fewer epochs.
    """
    model = base.copy() if base is not None else template.clone()
    if base is None and len(window):
        model.global_mean = float(np.mean(window.ratings))
    model.grow(window.user_ids, window.item_ids)
    return model


def run_training(
    model: BiasedMF | None,
    window: RatingsWindow,
    backend: TrainingBackend,
    configurator: Configurator,
    rule: ConvergenceRule,
    on_epoch: Callable[[EpochRecord], None] | None = None,
    *,
    history: Sequence[EpochRecord] = (),
    prepare: bool = True,
    item_bias_support: float = 0.0,
    interrupt: threading.Event | None = None,
) -> JobResult:
    """Train ``model`` on ``window`` until ``rule`` says stop; returns the result.

    Parameters
    ----------
    history
        Epochs the job already ran, numbered 0, 1, ... (a resumed job's checkpointed
        records). The next epoch is numbered ``len(history)``; the configurator sees them
        as observations; the rule counts their losses, their cost and, as elapsed time,
        their durations (the time the job stood still is not counted); the result lists
        them first. ``on_epoch`` is called for new epochs only. If the rule already says
        stop after ``history``, no epoch runs.
    prepare
        False when ``backend`` already holds the model and the training data (one
        restored from a checkpoint); ``model`` is then not used and may be None.
    item_bias_support
        The trained model's items are damped by their support in the training window
        (``BiasedMF.damp_items``) before the holdout is scored; 0 leaves them as
        trained.
    interrupt
        Once set, the job stops after the epoch in flight (``StopReason.PREEMPTED``):
        an epoch is the unit the backend keeps consistent (its deltas merged, its
        checkpoint written), so stopping between epochs leaves nothing half-done.
    """
    if len(window) == 0:
        raise ValueError("a retraining window needs at least one labelled event")
    epochs = list(history)
    numbers = [e.epoch for e in epochs]
    if numbers != list(range(len(epochs))):
        raise ValueError(f"history must hold epochs 0, 1, ... in order, got {numbers}")
    train, holdout = window.split_holdout()
    if prepare:
        if model is None:
            raise ValueError("a model is needed unless the backend is already prepared")
        backend.prepare(model, train)
    observations = [
        Observation(EpochConfig(**e.config), e.duration_s, e.loss, e.cost_usd, (), len(train))
        for e in epochs
    ]
    earlier_s = sum(e.duration_s for e in epochs)
    started = time.perf_counter()

    def check() -> StopReason | None:
        if interrupt is not None and interrupt.is_set():
            return StopReason.PREEMPTED
        spent = sum(e.cost_usd for e in epochs)
        elapsed = earlier_s + time.perf_counter() - started
        return rule.check([e.loss for e in epochs], elapsed, spent)

    stop = check() if epochs or (interrupt is not None and interrupt.is_set()) else None
    try:
        while stop is None:
            config = configurator.propose(len(epochs), observations)
            outcome = backend.run_epoch(config)
            decision = configurator.last_decision
            if decision is not None:
                decision = decision.observed(outcome.duration_s, outcome.cost_usd)
            record = EpochRecord(
                len(epochs),
                outcome.loss,
                outcome.duration_s,
                config.as_dict(),
                outcome.cost_usd,
                decision.as_dict() if decision is not None else None,
            )
            epochs.append(record)
            observations.append(
                Observation(
                    config,
                    outcome.duration_s,
                    outcome.loss,
                    outcome.cost_usd,
                    outcome.workers,
                    len(train),
                )
            )
            if on_epoch is not None:
                on_epoch(record)
            stop = check()
    finally:
        configurator.close(observations)
    trained = backend.result()
    trained.damp_items(train.item_ids, item_bias_support)
    return JobResult(
        model=trained,
        stop_reason=stop,
        epochs=epochs,
        holdout_rmse=_rmse(trained, holdout),
        train_events=len(train),
        holdout_events=len(holdout),
    )


def _rmse(model: BiasedMF, holdout: RatingsWindow) -> float | None:
    if len(holdout) == 0:
        return None
    predictions = model.predict(holdout.user_ids, holdout.item_ids)
    value = float(np.sqrt(np.mean((predictions - holdout.ratings) ** 2)))
    return value if math.isfinite(value) else None
