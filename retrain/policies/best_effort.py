"""Retrain whenever new data arrived and no job runs (Continuum's naive best-effort)."""

from __future__ import annotations

from dataclasses import dataclass

from retrain.policies.base import TriggerPolicy, bootstrap_trigger


@dataclass(frozen=True)
class BestEffortPolicy(TriggerPolicy):
    """Start the next job as soon as the previous one finished, whenever new labelled
    data arrived meanwhile.

    Continuum's "best-effort" baseline (Tian et al., *Continuum: A Platform for
    Cost-Aware, Low-Latency Continual Learning*, SoCC 2018, §4): the lowest
    data-incorporation latency a single training pipeline can reach, at the highest
    cost. The cost–accuracy benchmark measures every other policy's accuracy against it.
    The service asks ``on_progress`` only while no job runs, so "as soon as the previous
    one finished" needs no state here.

    Examples
    --------
    >>> policy = BestEffortPolicy(bootstrap_events=100)
    >>> policy.on_progress(100, since_version=None)
    'bootstrap'
    >>> policy.on_progress(500, since_version=0), policy.on_progress(501, since_version=1)
    (None, 'new-data')
    >>> policy.on_alert() is None
    True
    """

    bootstrap_events: int = 1000
    name: str = "best-effort"

    def on_alert(self) -> str | None:
        return None  # every job already starts as early as it can

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            return bootstrap_trigger(self.bootstrap_events, labelled_seen)
        return "new-data" if since_version > 0 else None

    def waiting_for(self, labelled_seen: int, since_version: int | None) -> str:
        if since_version is None:
            return super().waiting_for(labelled_seen, since_version)
        return "new data once the running job ends"
