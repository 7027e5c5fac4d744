"""Continuum's cost-aware rule: retrain when the latency regret of pending data
outweighs one retrain's fixed cost (Tian et al., SoCC 2018)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from retrain.policies.base import TriggerPolicy, bootstrap_trigger


def fit_training_time(jobs: list[tuple[float, float]], prior_fixed_s: float) -> tuple[float, float]:
    """Least-squares ``(α, β)`` of ``τ(n) = α·n + β`` over ``jobs`` as ``(n, seconds)``.

    With fewer than two distinct sizes the slope is unidentified: β is then the mean
    duration, or ``prior_fixed_s`` before any job, and α is 0. Both are kept
    non-negative, since a negative fixed cost would make the rule fire at once.

    >>> fit_training_time([(100, 12.0), (300, 16.0), (500, 20.0)], prior_fixed_s=30.0)
    (0.02, 10.0)
    >>> fit_training_time([], prior_fixed_s=30.0)
    (0.0, 30.0)
    """
    sizes = np.array([n for n, _ in jobs], dtype=float)
    seconds = np.array([s for _, s in jobs], dtype=float)
    if len(np.unique(sizes)) < 2:
        return 0.0, float(seconds.mean()) if len(seconds) else prior_fixed_s
    alpha, beta = np.polyfit(sizes, seconds, 1)
    return round(max(0.0, float(alpha)), 12), round(max(0.0, float(beta)), 12)


@dataclass
class ContinuumPolicy(TriggerPolicy):
    """Retrain when the latency regret of the pending data exceeds ``weight`` · β.

    Continuum (Tian et al., *Continuum: A Platform for Cost-Aware, Low-Latency Continual
    Learning*, SoCC 2018, §4.2) models a job's training time as ``τ(n) = α·n + β`` with
    ``α`` the per-sample cost and ``β`` the fixed cost of any retrain (start-up, model
    load, publish), refitted by least squares over the ``history`` most recent jobs.
    Had each pending event been trained on the moment it arrived, its incorporation
    latency would be the training time alone (``min``); waiting adds the time it has
    already waited (``all − min = Σᵢ (now − tᵢ)``, event-seconds). Retraining pays a
    fixed β no matter how much data waits, so the rule retrains once that regret
    exceeds ``weight`` · β; ``weight`` (Continuum's w, default 10) trades latency for
    fewer retrains and carries the exchange rate between event-seconds of waiting and
    seconds of training. Events that arrive while a job runs wait for the next one.

    Examples
    --------
    >>> policy = ContinuumPolicy(bootstrap_events=10, weight=10, prior_fixed_s=5.0)
    >>> policy.observe_events(10, now=0.0)
    >>> policy.on_progress(10, since_version=None)
    'bootstrap'
    >>> policy.observe_job(10, seconds=5.0)
    >>> policy.observe_events(2, now=100.0)
    >>> policy.observe_events(2, now=110.0)
    >>> round(policy.regret(), 1), policy.threshold()
    (20.0, 50.0)
    >>> policy.waiting_for(14, since_version=4)
    'regret 0.4 of threshold'
    >>> policy.on_progress(14, since_version=4)
    >>> policy.observe_events(0, now=120.0)
    >>> policy.on_progress(14, since_version=4)
    'regret'
    >>> policy.regret()
    0.0
    """

    bootstrap_events: int = 1000
    weight: float = 10.0
    prior_fixed_s: float = 30.0
    history: int = 20
    name: str = "continuum"
    _jobs: deque[tuple[float, float]] = field(default_factory=deque, repr=False)
    _pending: float = field(default=0.0, repr=False)
    _pending_time_sum: float = field(default=0.0, repr=False)
    _now: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"weight must be positive, got {self.weight}")
        self._jobs = deque(maxlen=self.history)

    def on_alert(self) -> str | None:
        return None

    def observe_events(self, n_events: float, now: float) -> None:
        self._now = now
        self._pending += n_events
        self._pending_time_sum += n_events * now

    def observe_job(self, n_events: float, seconds: float) -> None:
        self._jobs.append((n_events, seconds))

    @property
    def jobs(self) -> tuple[tuple[float, float], ...]:
        """The recent jobs ``τ(n)`` is fitted on, as ``(n_events, seconds)``."""
        return tuple(self._jobs)

    def regret(self) -> float:
        """``all − min``: event-seconds the pending data has waited so far."""
        return max(0.0, self._pending * self._now - self._pending_time_sum)

    def threshold(self) -> float:
        """``w · β`` with β from the current fit of ``τ(n)``."""
        return self.weight * fit_training_time(list(self._jobs), self.prior_fixed_s)[1]

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            trigger = bootstrap_trigger(self.bootstrap_events, labelled_seen)
        else:
            trigger = "regret" if self._pending > 0 and self.regret() > self.threshold() else None
        if trigger is not None:  # the pending data goes into this job
            self._pending = self._pending_time_sum = 0.0
        return trigger

    def waiting_for(self, labelled_seen: int, since_version: int | None) -> str:
        if since_version is None:
            return super().waiting_for(labelled_seen, since_version)
        threshold = self.threshold()
        share = self.regret() / threshold if threshold > 0 else float("inf")
        return f"regret {share:.1f} of threshold"
