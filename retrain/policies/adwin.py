"""Retrain on a confirmed drift alert (Driftline's default; SandPiper (Ali et al.), §III-A)."""

from __future__ import annotations

from dataclasses import dataclass

from retrain.policies.base import TriggerPolicy, bootstrap_trigger


@dataclass(frozen=True)
class AdwinPolicy(TriggerPolicy):
    """Retrain on every confirmed drift alert; train a first model after a warm-up.

    SandPiper triggers retraining when its drift detector (ADWIN, Bifet & Gavaldà 2007)
    confirms a drop in accuracy; Driftline's detector is configurable (``DRIFT_DETECTOR``)
    and the policy keeps the name. Without a model there is nothing for the detector to
    watch, so the first job starts once ``bootstrap_events`` labelled events are in. The
    detector answers "has accuracy dropped?"; a stream that keeps bringing new users and
    items can leave accuracy flat while the version falls behind the catalogue, so
    ``refresh_events`` (None to disable) also retrains once that many labelled events
    arrived since the serving version.

    Examples
    --------
    >>> policy = AdwinPolicy(bootstrap_events=100, refresh_events=5_000)
    >>> policy.on_progress(99, since_version=None), policy.on_progress(100, since_version=None)
    (None, 'bootstrap')
    >>> policy.on_progress(10_000, since_version=20), policy.on_alert()
    (None, 'drift')
    >>> policy.on_progress(10_000, since_version=5_000)
    'refresh'
    >>> policy.waiting_for(10_000, since_version=4_000)
    'a drift alert, or a refresh in 1000 events'
    """

    bootstrap_events: int = 1000
    refresh_events: int | None = None
    name: str = "adwin"

    def on_alert(self) -> str | None:
        return "drift"

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            return bootstrap_trigger(self.bootstrap_events, labelled_seen)
        if self.refresh_events is not None and since_version >= self.refresh_events:
            return "refresh"
        return None

    def waiting_for(self, labelled_seen: int, since_version: int | None) -> str:
        if since_version is None or self.refresh_events is None:
            return super().waiting_for(labelled_seen, since_version)
        return f"a drift alert, or a refresh in {self.refresh_events - since_version} events"
