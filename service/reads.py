"""Read models: what the API and the dashboard read about the running stream.

Routes and pages never reach into the stream's components: they read here, and each
read takes a snapshot the owner publishes (the learner's counters and tracks, the
monitor's unsaved heartbeats, the lifecycle's running job) or a row from the store.
"""

from __future__ import annotations

import math
from typing import Any

from retrain.lifecycle import Retrainer
from service.cluster.leadership import Leadership
from service.cluster.logtail import LogTail
from service.rollout.guard import RolloutGuard
from service.serving.registry import LoadedVersion, ModelRegistry
from service.store import Database
from service.store.alerts import list_heartbeats
from service.store.jobs import active_job_ids
from service.stream.learner import Learner
from service.stream.monitor import StreamMonitor
from service.stream.trigger import RetrainTrigger


class StreamReads:
    """The stream's state as the API and the dashboard show it."""

    def __init__(
        self,
        db: Database,
        registry: ModelRegistry,
        learner: Learner,
        monitor: StreamMonitor,
        trigger: RetrainTrigger,
        retrainer: Retrainer,
        leadership: Leadership,
        tail: LogTail,
        *,
        min_relative_rise: float,
        budget_usd: float | None,
        guard: RolloutGuard | None = None,
    ) -> None:
        self.db = db
        self.registry = registry
        self._learner = learner
        self._monitor = monitor
        self._trigger = trigger
        self._retrainer = retrainer
        self._leadership = leadership
        self._tail = tail
        self.min_relative_rise = min_relative_rise
        self.budget_usd = budget_usd
        self._guard = guard
        #: Log positions this replica replayed when it started (set by ``restore``).
        self.replayed_at_start: int | None = None

    def cluster_status(self) -> dict[str, Any]:
        """This replica in the cluster: its name, who leads, and how far it has applied
        the event log (``applied_position``) of what it last saw (``log_position``), and
        how much of it it replayed when it started (``replayed_at_start``)."""
        applied = self._learner.applied
        return {
            **self._leadership.status(),
            "applied_position": applied,
            "log_position": max(self._tail.seen_head, applied),
            "log_lag_events": self._tail.lag,
            "replayed_at_start": self.replayed_at_start,
        }

    @property
    def serving_version(self) -> str | None:
        return self._learner.serving.version

    @property
    def current(self) -> LoadedVersion | None:
        return self._learner.current

    @property
    def labelled_seen(self) -> int:
        return self._learner.labelled_seen

    @property
    def running_job_id(self) -> int | None:
        """The job running here, or else anywhere in the cluster (from the store)."""
        here = self._retrainer.active_job_id
        if here is not None or self._leadership.is_leader:
            return here
        with self.db.connect() as conn:
            active = active_job_ids(conn)
        return active[0] if active else None

    def accuracy_summary(self) -> dict[str, dict[str, Any]]:
        """Running RMSE, hit-rate@10 and NDCG@10 per track (``/healthz``, overview)."""
        return self._learner.accuracy_summary()

    def policy_status(self) -> dict[str, str]:
        return self._trigger.policy_status()

    def heartbeats(self, since_events: int = 0) -> list[dict]:
        """Stored heartbeats and those waiting for the next write, oldest first.

        A heartbeat committed between the two reads is in both; the store's copy wins.
        """
        pending = self._monitor.pending_heartbeats()
        with self.db.connect() as conn:
            stored = list_heartbeats(conn, since_events)
        after = max([since_events, *(row["events_seen"] for row in stored[-1:])])
        return stored + [row for row in pending if row["events_seen"] > after]

    def alert_band(self) -> dict[str, float] | None:
        """The band between the detector's reference RMSE and the RMSE that raises an
        alert (None: the detector has no reference yet, or keeps none)."""
        level = getattr(self._monitor.detector, "level", None)
        if level is None:
            return None
        rise = self.min_relative_rise
        return {"reference_rmse": math.sqrt(level), "alert_rmse": math.sqrt(level * (1 + rise))}

    # -- the rollout guard ------------------------------------------------------------------
    def rollouts(self) -> dict[str, dict[str, Any]]:
        """Each guarded version's rollout (``rollout_summary``), by version; the running
        comparison's figures as this replica's guard has them, when it runs one and
        they are newer than the saved ones (``_newer``)."""
        rows = {row["version"]: dict(row) for row in self.registry.rollouts()}
        live = None if self._guard is None else self._guard.status()
        if live is not None:
            row = rows.get(live["rollout_of"])
            column = "shadow" if live["role"] == "candidate" else "watch"
            saved = None if row is None else row.get(column)
            if row is not None and _newer(live, saved):
                row[column] = live
        return {version: rollout_summary(row) for version, row in rows.items()}

    def in_rollout(self) -> dict[str, Any] | None:
        """The version in shadow, or else the one under watch, for the overview."""
        rollouts = self.rollouts()
        for state in ("shadow", "watch"):
            found = [(v, r) for v, r in rollouts.items() if r["state"] == state]
            if found:
                version, summary = found[-1]
                return {"version": version, **summary}
        return None


def rollout_summary(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout row as ``/models`` and the versions page show it: its state and times,
    the shadow's figures at the top (events compared, differences with intervals,
    decision and reason) and both comparisons in full."""
    shadow, watch = row.get("shadow"), row.get("watch")
    top = shadow or {}
    return {
        "state": row["state"],
        "compared_with": row.get("compared_with"),
        "published_at": row["published_at"],
        "decided_at": row.get("decided_at"),
        "promoted_at": row.get("promoted_at"),
        "watch_ended_at": row.get("watch_ended_at"),
        "events_compared": top.get("events_compared") or 0,
        "rmse_diff": top.get("rmse_diff"),
        "hit_rate_diff": top.get("hit_rate_diff"),
        "ndcg_diff": top.get("ndcg_diff"),
        "decision": top.get("decision"),
        "reason": top.get("reason"),
        "shadow": _comparison(shadow),
        "watch": _comparison(watch),
    }


def _comparison(figures: dict[str, Any] | None) -> dict[str, Any] | None:
    """A comparison's figures with every key the public schema has (a row saved while
    no events were compared yet lacks some)."""
    if not figures or "events_compared" not in figures:
        return None
    keys = (
        "role",
        "compared_with",
        "events_compared",
        "users",
        "ranked_events",
        "confidence",
        "old_rmse",
        "old_hit_rate",
        "rmse_diff",
        "hit_rate_diff",
        "ndcg_diff",
        "decision",
        "reason",
    )
    return {key: figures.get(key) for key in keys}


def _newer(live: dict[str, Any], saved: dict[str, Any] | None) -> bool:
    """Whether a running comparison's figures replace the saved ones: not once those
    hold a decision, nor while the same comparison restarted (after a restart, or on a
    new leader) has compared fewer events than were saved before."""
    if saved is None:
        return True
    if saved.get("decision") is not None:
        return False
    if live.get("compared_with") != saved.get("compared_with"):
        return True  # a comparison with another version: the saved one is over
    return int(live.get("events_compared") or 0) >= int(saved.get("events_compared") or 0)
