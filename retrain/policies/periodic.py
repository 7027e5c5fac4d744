"""Retrain every N labelled events."""

from __future__ import annotations

from dataclasses import dataclass

from retrain.policies.base import TriggerPolicy, bootstrap_trigger


@dataclass(frozen=True)
class PeriodicPolicy(TriggerPolicy):
    """Retrain once ``every_events`` labelled events arrived since the serving version.

    The count-based schedule production pipelines start with (TFX's and SageMaker's
    "retrain every N new examples"); it ignores both accuracy and the clock, so it
    retrains as often in a quiet regime as after a drift. ``every_events`` is its knob.

    Examples
    --------
    >>> policy = PeriodicPolicy(bootstrap_events=100, every_events=1_000)
    >>> policy.on_progress(100, since_version=None)
    'bootstrap'
    >>> policy.on_progress(5_000, since_version=999), policy.on_progress(5_001, since_version=1_000)
    (None, 'periodic')
    >>> policy.waiting_for(5_000, since_version=400)
    'next retrain in 600 events'
    """

    bootstrap_events: int = 1000
    every_events: int = 10_000
    name: str = "periodic"

    def __post_init__(self) -> None:
        if self.every_events < 1:
            raise ValueError(f"every_events must be at least 1, got {self.every_events}")

    def on_alert(self) -> str | None:
        return None

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            return bootstrap_trigger(self.bootstrap_events, labelled_seen)
        return "periodic" if since_version >= self.every_events else None

    def waiting_for(self, labelled_seen: int, since_version: int | None) -> str:
        if since_version is None:
            return super().waiting_for(labelled_seen, since_version)
        return f"next retrain in {max(0, self.every_events - since_version)} events"
