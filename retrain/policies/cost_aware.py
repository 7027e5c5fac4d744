"""Batch the data and retrain every few minutes (SandPiper's cost-aware baseline)."""

from __future__ import annotations

from dataclasses import dataclass, field

from retrain.policies.base import TriggerPolicy, bootstrap_trigger


@dataclass
class CostAwarePolicy(TriggerPolicy):
    """Retrain every ``interval_s`` seconds on the data batched since the last job.

    SandPiper's (Ali et al.) cost-aware policy (§V-B, Fig. 7: "batches data and retrains
    every 5 minutes"): fewer, larger jobs than best-effort, at the price of up to one
    interval of data-incorporation latency. The interval runs from the first batch seen
    after the first model and restarts whenever a batch job starts; a due batch with no
    new data waits for some. The clock is whatever ``observe_events`` is given (wall
    time in the service, virtual time in the benchmark).

    Examples
    --------
    >>> policy = CostAwarePolicy(bootstrap_events=10, interval_s=300)
    >>> policy.on_progress(10, since_version=None)
    'bootstrap'
    >>> policy.observe_events(50, now=1_000.0)
    >>> policy.on_progress(60, since_version=50)
    >>> policy.observe_events(50, now=1_088.0)
    >>> policy.waiting_for(110, since_version=100)
    'next batch in 212 s'
    >>> policy.observe_events(50, now=1_300.0)
    >>> policy.on_progress(160, since_version=150)
    'batch'
    """

    bootstrap_events: int = 1000
    interval_s: float = 300.0
    name: str = "cost-aware"
    _now: float | None = field(default=None, repr=False)
    _last: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {self.interval_s}")

    def on_alert(self) -> str | None:
        return None

    def observe_events(self, n_events: float, now: float) -> None:
        self._now = now

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            return bootstrap_trigger(self.bootstrap_events, labelled_seen)
        if self._now is None:
            return None
        if self._last is None:
            self._last = self._now
        if since_version > 0 and self._now - self._last >= self.interval_s:
            self._last = self._now
            return "batch"
        return None

    def waiting_for(self, labelled_seen: int, since_version: int | None) -> str:
        if since_version is None:
            return super().waiting_for(labelled_seen, since_version)
        if self._now is None or self._last is None:
            return f"next batch {self.interval_s:.0f} s after the next events"
        return f"next batch in {max(0.0, self._last + self.interval_s - self._now):.0f} s"
