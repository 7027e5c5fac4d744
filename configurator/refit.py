"""Refitting the residual GPs' hyper-parameters off the critical path.

A decision only conditions the GPs on the newest epoch; their hyper-parameters are
refitted on a growing schedule (1, 2, 3, 5, 8, ... observations), on a thread while the
epoch runs, and the next decision adopts what a finished refit left.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from configurator.base import Observation
from configurator.epoch_model import EpochModel
from configurator.residuals import ResidualGps, TrainingData

log = logging.getLogger(__name__)


class Refits:
    """When the residual GPs are refitted, and where (a thread, or in line).

    Parameters
    ----------
    gps
        The GPs refitted.
    data
        Their training data after a job's epochs, against a model.
    growth
        Refit when the distinct observations have grown by this factor since the last.
    background
        Refit on a thread (the service); False refits in line (reproducible).
    """

    def __init__(
        self,
        gps: ResidualGps,
        data: Callable[[Sequence[Observation], EpochModel], TrainingData],
        growth: float,
        background: bool,
    ) -> None:
        self._gps = gps
        self._data = data
        self._growth = growth
        self._background = background
        self._refit_at = 1
        self._thread: threading.Thread | None = None
        self._pending: dict[str, dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def schedule(self, history: Sequence[Observation], model: EpochModel) -> None:
        """Refit when the schedule says so, on a thread while the epoch runs or at once
        (after the decision was timed); not while a refit is still in flight."""
        if not self._gps.applies(history):
            return
        n = len(history) + sum(len(j.epochs) for j in self._gps.past)
        if n < self._refit_at:
            return
        if self._thread is not None and self._thread.is_alive():
            return  # the next decision goes on with the hyper-parameters it has
        self._refit_at = max(n + 1, math.ceil(n * self._growth))
        if not self._background:
            self._refit(list(history), model)
            self.take()
            return
        thread = threading.Thread(
            target=self._refit, args=(list(history), model), name="gp-opt-refit", daemon=True
        )
        self._thread = thread
        thread.start()

    def _refit(self, history: list[Observation], model: EpochModel) -> None:
        try:
            states = self._gps.refitted(self._data(history, model))
        except Exception:  # the next decision goes on with the hyper-parameters it has
            log.exception("GP-OPT: background refit failed")
            return
        with self._lock:
            self._pending = states

    def take(self) -> None:
        """Adopt the hyper-parameters a finished refit left."""
        with self._lock:
            pending, self._pending = self._pending, None
        self._gps.load(pending or {})

    def join(self) -> None:
        """Wait for a refit in flight."""
        if self._thread is not None:
            self._thread.join()
