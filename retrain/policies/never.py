"""Bootstrap only: the floor a retraining policy has to beat."""

from __future__ import annotations

from dataclasses import dataclass

from retrain.policies.base import TriggerPolicy, bootstrap_trigger


@dataclass(frozen=True)
class NeverPolicy(TriggerPolicy):
    """Train a first model after the warm-up and never again: the online fold-in alone
    follows the stream. The yardstick a retraining policy has to beat (the "static"
    model of SandPiper's and Continuum's evaluations).

    Examples
    --------
    >>> policy = NeverPolicy(bootstrap_events=100)
    >>> policy.on_progress(100, since_version=None), policy.on_progress(10**6, since_version=10**6)
    ('bootstrap', None)
    >>> policy.on_alert() is None
    True
    >>> policy.waiting_for(10**6, since_version=10**6)
    'nothing (never retrains)'
    """

    bootstrap_events: int = 1000
    refresh_events: int | None = None
    name: str = "never"

    def on_alert(self) -> str | None:
        return None

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            return bootstrap_trigger(self.bootstrap_events, labelled_seen)
        return None
