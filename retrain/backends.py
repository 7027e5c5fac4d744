"""Where an epoch's SGD runs.

A job talks to a ``TrainingBackend`` only: prepare it with a model and a window, run
epochs with a config vector, take the trained model back. The in-process backend runs
the numpy trainer of ``functions/`` in this process; distributed backends (workers that
exchange updates through the object store) implement the same three calls.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from configurator.base import WorkerRun
from configurator.space import EpochConfig
from functions.mf import BiasedMF
from retrain.window import RatingsWindow


@dataclass(frozen=True)
class EpochOutcome:
    """What one epoch cost and achieved."""

    loss: float
    duration_s: float
    cost_usd: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    #: The worker invocations the epoch launched (distributed backends), for the
    #: configurator's recalibration.
    workers: tuple[WorkerRun, ...] = ()


class TrainingBackend(ABC):
    """Runs the epochs of one retraining job."""

    name: str

    @abstractmethod
    def prepare(self, model: BiasedMF, train: RatingsWindow) -> None:
        """Take ownership of ``model`` (already grown for the window) and the data."""

    @abstractmethod
    def run_epoch(self, config: EpochConfig) -> EpochOutcome:
        """One pass over the window with ``config``."""

    @abstractmethod
    def result(self) -> BiasedMF:
        """The model as trained so far."""


class InProcessBackend(TrainingBackend):
    """Vectorised minibatch SGD in this process, on the numpy model of ``functions/``."""

    name = "inprocess"

    def __init__(self, seed: int | None = None) -> None:
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._model: BiasedMF | None = None

    def prepare(self, model: BiasedMF, train: RatingsWindow) -> None:
        self._model = model
        self._users = model.encode_users(train.user_ids)
        self._items = model.encode_items(train.item_ids)
        self._ratings = np.asarray(train.ratings, dtype=np.float64)

    def run_epoch(self, config: EpochConfig) -> EpochOutcome:
        model = self._require_model()
        model.learning_rate = config.learning_rate
        started = time.perf_counter()
        loss = model.fit_epoch(
            self._users, self._items, self._ratings, batch_size=config.batch_size, rng=self._rng
        )
        return EpochOutcome(loss=float(loss), duration_s=time.perf_counter() - started)

    def result(self) -> BiasedMF:
        return self._require_model()

    def _require_model(self) -> BiasedMF:
        if self._model is None:
            raise RuntimeError("prepare() must be called before training")
        return self._model
