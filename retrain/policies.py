"""Trigger policies: when the service starts a retraining job.

Policies join through ``POLICIES`` by name, so the service never branches on a policy's
type. Each answers two questions: does this drift alert warrant a job, and do the events
seen so far warrant one on their own (a first model, a schedule)?
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass


class TriggerPolicy(ABC):
    """Decides which events in the stream start a retraining job."""

    name: str

    @abstractmethod
    def on_alert(self) -> str | None:
        """The trigger name for a confirmed drift alert, or None to ignore it."""

    @abstractmethod
    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        """The trigger name if the stream alone warrants a job now, else None.

        ``since_version`` counts labelled events since the serving version was
        published; None means no version exists yet.
        """


@dataclass(frozen=True)
class AdwinPolicy(TriggerPolicy):
    """Retrain on every confirmed ADWIN alert; train a first model after a warm-up.

    Without a model there is nothing for ADWIN to watch, so the first job starts once
    ``bootstrap_events`` labelled events are in. ADWIN answers "has accuracy dropped?";
    a stream that keeps bringing new users and items can leave accuracy flat while the
    version falls behind the catalogue, so ``refresh_events`` (None to disable) also
    retrains once that many labelled events arrived since the serving version.

    Examples
    --------
    >>> policy = AdwinPolicy(bootstrap_events=100, refresh_events=5_000)
    >>> policy.on_progress(99, since_version=None), policy.on_progress(100, since_version=None)
    (None, 'bootstrap')
    >>> policy.on_progress(10_000, since_version=20), policy.on_alert()
    (None, 'drift')
    >>> policy.on_progress(10_000, since_version=5_000)
    'refresh'
    """

    bootstrap_events: int = 1000
    refresh_events: int | None = None
    name: str = "adwin"

    def on_alert(self) -> str | None:
        return "drift"

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None:
            return "bootstrap" if labelled_seen >= self.bootstrap_events else None
        if self.refresh_events is not None and since_version >= self.refresh_events:
            return "refresh"
        return None


@dataclass(frozen=True)
class NeverPolicy(TriggerPolicy):
    """Train a first model after the warm-up and never again: the online fold-in alone
    follows the stream. The yardstick a retraining policy has to beat.

    Examples
    --------
    >>> policy = NeverPolicy(bootstrap_events=100)
    >>> policy.on_progress(100, since_version=None), policy.on_progress(10**6, since_version=10**6)
    ('bootstrap', None)
    >>> policy.on_alert() is None
    True
    """

    bootstrap_events: int = 1000
    refresh_events: int | None = None
    name: str = "never"

    def on_alert(self) -> str | None:
        return None

    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        if since_version is None and labelled_seen >= self.bootstrap_events:
            return "bootstrap"
        return None


#: Trigger policies by name (``RETRAIN_POLICY``); each is built with the settings'
#: ``bootstrap_events`` and ``refresh_events``.
POLICIES: dict[str, Callable[..., TriggerPolicy]] = {"adwin": AdwinPolicy, "never": NeverPolicy}
