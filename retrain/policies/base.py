"""The trigger policy interface every policy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod


class TriggerPolicy(ABC):
    """Decides which events in the stream start a retraining job.

    Two questions are abstract: does this drift alert warrant a job (``on_alert``), and
    do the events seen so far warrant one on their own (``on_progress``)? Policies that
    need the clock or the cost of past jobs (a batching interval, Continuum's training
    time model) also hear of every ingested batch (``observe_events``) and of every
    completed job (``observe_job``); both default to doing nothing, so a policy written
    against the two-method interface keeps working. ``waiting_for`` says in words what
    the policy waits for, for ``/healthz``.
    """

    name: str

    @abstractmethod
    def on_alert(self) -> str | None:
        """The trigger name for a confirmed drift alert, or None to ignore it."""

    @abstractmethod
    def on_progress(self, labelled_seen: int, since_version: int | None) -> str | None:
        """The trigger name if the stream alone warrants a job now, else None.

        ``since_version`` counts labelled events since the serving version was
        published; None means no version exists yet. Called only while no job runs.
        """

    def observe_events(self, n_events: float, now: float) -> None:  # noqa: B027
        """``n_events`` labelled events arrived at ``now`` (seconds, any fixed origin).

        Called for every ingested batch, whether or not a job runs; ``n_events`` may be
        fractional where one event stands for many (a benchmark's weighted stream).
        """

    def observe_job(self, n_events: float, seconds: float) -> None:  # noqa: B027
        """A job over ``n_events`` events completed in ``seconds`` (start to swap)."""

    def waiting_for(self, labelled_seen: int, since_version: int | None) -> str:
        """What this policy waits for before its next job, in words."""
        if since_version is None:
            left = max(0, getattr(self, "bootstrap_events", 0) - labelled_seen)
            return f"first model after {left} more labelled events"
        return "a drift alert" if self.on_alert() is not None else "nothing (never retrains)"


def bootstrap_trigger(bootstrap_events: int, labelled_seen: int) -> str | None:
    """'bootstrap' once ``bootstrap_events`` labelled events are in: every policy trains a
    first model after the warm-up, since without one there is nothing to serve or watch."""
    return "bootstrap" if labelled_seen >= bootstrap_events else None
