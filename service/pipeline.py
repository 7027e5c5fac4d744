"""The stream pipeline: store, then test-then-train, then drift monitoring.

Every labelled event is predicted by the model serving at that moment before it is used
for anything else (DESIGN.md §6); the squared errors are grouped into heartbeats, ADWIN
watches the heartbeat RMSE, and a confirmed alert asks the retrainer for a new version,
which comes back through ``swap``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from drift import DriftAlert, DriftMonitor, Heartbeat, HeartbeatAggregator, PrequentialTracker
from functions.artifacts import ArtifactError
from functions.mf import BiasedMF
from retrain import POLICIES, TriggerPolicy
from service.metrics import Metrics
from service.registry import LoadedVersion, ModelRegistry
from service.retraining import Retrainer
from service.serving import ServingModel
from service.settings import Settings
from service.store import Database
from service.store.alerts import add_alert, add_heartbeats, list_heartbeats
from service.store.events import (
    IngestOutcome,
    NewEvent,
    count_events,
    labelled_events,
    popular_items,
    rated_items,
    store_events,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recommendation:
    user_id: str
    items: list[tuple[str, float]]
    model_version: str
    source: str  # "model" or "popular"


class Pipeline:
    """One service instance's stream processing and serving state."""

    def __init__(
        self,
        settings: Settings,
        db: Database,
        registry: ModelRegistry,
        metrics: Metrics,
        *,
        background_retrain: bool = True,
    ) -> None:
        self.settings = settings
        self.db = db
        self.registry = registry
        self.metrics = metrics
        self.serving = self._serving_for(None)
        self.current: LoadedVersion | None = None
        self.static: BiasedMF | None = None
        self.tracker = PrequentialTracker()
        self.aggregator = HeartbeatAggregator(settings.heartbeat_events, settings.heartbeat_seconds)
        self.monitor = DriftMonitor(
            delta=settings.adwin_delta,
            min_relative_drop=settings.min_relative_drop,
            min_heartbeats=settings.min_heartbeats,
        )
        self.policy: TriggerPolicy = POLICIES["adwin"](
            bootstrap_events=settings.bootstrap_events, refresh_events=settings.refresh_events
        )
        self.retrainer = Retrainer(
            settings,
            db,
            registry,
            metrics,
            current=lambda: self.current,
            on_published=self.swap,
            background=background_retrain,
        )
        self.labelled_seen = 0
        self._events_offset = 0
        self._seen_at_swap = 0
        self._static_pending = np.empty(0)
        self._unsaved_heartbeats: list[dict] = []
        self._lock = threading.Lock()

    # -- start-up ---------------------------------------------------------------
    def restore(self) -> None:
        """Resume after a restart: newest verified version, fold-in replayed, clocks restored."""
        with self.db.connect() as conn:
            # Every stored labelled event was evaluated right after its commit.
            self._events_offset = count_events(conn, labelled_only=True)
        self.labelled_seen = self._events_offset
        oldest = self.registry.oldest_loadable()
        self.static = oldest.model if oldest else None
        newest = self.registry.newest_loadable()
        if newest is not None:
            self.swap(newest)
        else:
            with self.db.connect() as conn:
                replay = labelled_events(conn)
            self.serving.learn(replay.user_ids, replay.item_ids, replay.ratings)

    # -- ingestion ----------------------------------------------------------------
    def ingest(
        self,
        batch: Sequence[NewEvent],
        also_write: Callable[[Connection], None] | None = None,
    ) -> IngestOutcome:
        """Store ``batch`` atomically, then evaluate and learn from the new events.

        The batch is durable before this returns; evaluation happens after the commit,
        so a failure there can never lose an acknowledged event. Heartbeats ride along
        with the next batch's transaction instead of costing a commit of their own;
        alerts are written at once. ``also_write`` runs inside the same transaction
        (the Kafka consumer records its offsets there).
        """
        with self._lock:
            with self.db.begin() as conn:
                outcome = store_events(conn, batch)
                if also_write is not None:
                    also_write(conn)
                add_heartbeats(conn, self._unsaved_heartbeats)
            self._unsaved_heartbeats = []
            alerts = self._evaluate_and_learn(outcome.stored)
        self.metrics.events_ingested.inc(outcome.accepted)
        self.metrics.events_duplicate.inc(outcome.duplicates)
        try:
            self._trigger(alerts)
        except SQLAlchemyError:
            # The batch is committed; answering with an error would invite a retry of
            # data already stored. The next alert or progress check triggers again.
            log.exception("could not start a retraining job; the ingested batch is stored")
        return outcome

    def _evaluate_and_learn(self, stored: Sequence[NewEvent]) -> list[int]:
        labelled = [e for e in stored if e.rating is not None]
        if not labelled:
            return []
        users = [e.user_id for e in labelled]
        items = [e.item_id for e in labelled]
        ratings = np.fromiter((e.rating for e in labelled), dtype=np.float64, count=len(labelled))
        predicted = self.serving.predict_then_learn(users, items, ratings)
        static = self._static_predict(users, items, predicted)
        self.tracker.record("driftline", ratings, predicted)
        self.tracker.record("static", ratings, static)
        self._static_pending = np.concatenate([self._static_pending, (ratings - static) ** 2])
        heartbeats = self.aggregator.add((ratings - predicted) ** 2)
        self.labelled_seen += len(labelled)
        self.metrics.labelled_events.inc(len(labelled))
        return self._record_heartbeats(heartbeats)

    def _static_predict(self, users: list[str], items: list[str], live: np.ndarray) -> np.ndarray:
        """The never-retrained baseline: the first version, frozen, without fold-in.

        Until a first version exists both tracks are the same predictor.
        """
        if self.static is None:
            return live
        return self.static.predict(
            users, items, clip=(self.settings.rating_min, self.settings.rating_max)
        )

    def _record_heartbeats(self, heartbeats: list[Heartbeat]) -> list[int]:
        if not heartbeats:
            return []
        alerts = []
        for beat in heartbeats:
            static_sq, self._static_pending = (
                self._static_pending[: beat.events],
                self._static_pending[beat.events :],
            )
            row = self._heartbeat_row(beat, float(np.sqrt(static_sq.mean())))
            self._unsaved_heartbeats.append(row)
            alert = self.monitor.update(beat) if self.current is not None else None
            if alert is not None:
                alerts.append(alert)
        if not alerts:
            return []
        try:
            return self.flush(alerts)
        except SQLAlchemyError:
            log.exception("could not store %d drift alert(s) after a committed batch", len(alerts))
            return []

    def flush(self, alerts: Sequence[DriftAlert] = ()) -> list[int]:
        """Write heartbeats not yet saved, and ``alerts``; returns the alerts' ids."""
        with self.db.begin() as conn:
            add_heartbeats(conn, self._unsaved_heartbeats)
            alert_ids = [self._store_alert(conn, alert) for alert in alerts]
        self._unsaved_heartbeats = []
        return alert_ids

    def _heartbeat_row(self, beat: Heartbeat, static_rmse: float) -> dict:
        self.metrics.prequential_rmse.labels(model="driftline").set(beat.rmse)
        self.metrics.prequential_rmse.labels(model="static").set(static_rmse)
        return {
            "at": time.time(),
            "events_seen": self._events_offset + beat.events_seen,
            "events": beat.events,
            "rmse": beat.rmse,
            "static_rmse": static_rmse,
            "model_version": self.serving.version,
        }

    def _store_alert(self, conn, alert: DriftAlert) -> int:  # type: ignore[no-untyped-def]
        self.metrics.drift_alerts.inc()
        log.warning(
            "drift: %s %.4f -> %.4f after %d events",
            alert.metric,
            alert.before,
            alert.after,
            self._events_offset + alert.events_seen,
        )
        return add_alert(
            conn,
            metric=alert.metric,
            before=alert.before,
            after=alert.after,
            events_seen=self._events_offset + alert.events_seen,
            model_version=self.serving.version,
        )

    def _trigger(self, alert_ids: list[int]) -> None:
        if not self.settings.retrain_enabled:
            return
        for alert_id in alert_ids:
            trigger = self.policy.on_alert()
            if trigger is not None:
                self.retrainer.request(trigger, alert_id)
        if self.retrainer.active_job_id is None:
            since = None if self.current is None else self.labelled_seen - self._seen_at_swap
            trigger = self.policy.on_progress(self.labelled_seen, since)
            if trigger is not None:
                self.retrainer.request(trigger)

    # -- model versions -----------------------------------------------------------
    def swap(self, loaded: LoadedVersion) -> None:
        """Serve ``loaded`` from now on, with fold-in of everything it has not seen.

        The fold-in starts ``fold_in_replay_events`` before the version's last event:
        the version knows each user's long-run taste, the fold-in their latest ratings,
        which a version trained on everything averages away. The replay runs outside
        the lock so ingestion keeps flowing; only the events stored during the replay
        are folded in under the lock, just before the switch.
        """
        serving = self._serving_for(loaded)
        start = max(0, loaded.last_event_id - self.settings.fold_in_replay_events)
        with self.db.connect() as conn:
            replay = labelled_events(conn, after_id=start)
            caught_up_to = int(replay.ids[-1]) if len(replay) else loaded.last_event_id
        serving.learn(replay.user_ids, replay.item_ids, replay.ratings)
        with self._lock:
            with self.db.connect() as conn:
                rest = labelled_events(conn, after_id=caught_up_to)
            serving.learn(rest.user_ids, rest.item_ids, rest.ratings)
            self.serving = serving
            self.current = loaded
            self._seen_at_swap = self.labelled_seen
            if self.static is None:
                self.static = loaded.model
            self.monitor.reset()
        self.metrics.model_swaps.inc()
        log.info("serving model %s", loaded.version)

    def swap_to(self, version: str) -> bool:
        """Load ``version`` from the registry and serve it; a bad artifact keeps the old one."""
        try:
            loaded = self.registry.load(version)
        except ArtifactError as exc:
            self.metrics.model_load_failures.inc()
            log.error("refusing model %s: %s; still serving %s", version, exc, self.serving.version)
            return False
        self.swap(loaded)
        return True

    def follow_registry(self) -> bool:
        """Serve the registry's newest version if another process published it.

        Consumer replicas and servers that share a database also share versions: a
        version published anywhere is picked up here. Returns whether it swapped.
        """
        versions = self.registry.versions()
        if not versions or versions[0]["version"] == self.serving.version:
            return False
        if self.current is not None and versions[0]["created_at"] <= self.current.row["created_at"]:
            return False
        return self.swap_to(versions[0]["version"])

    def _serving_for(self, loaded: LoadedVersion | None) -> ServingModel:
        return ServingModel(
            loaded.model if loaded else None,
            loaded.version if loaded else None,
            regularization=self.settings.fold_in_regularization,
            bias_regularization=self.settings.fold_in_bias_regularization,
            forgetting=self.settings.fold_in_forgetting,
            rating_range=(self.settings.rating_min, self.settings.rating_max),
        )

    # -- serving --------------------------------------------------------------------
    def recommend(self, user_id: str, k: int) -> Recommendation:
        """Top-``k`` unseen items; users the model cannot place get what is popular now."""
        serving = self.serving
        version = serving.version or "none"
        with self.db.connect() as conn:
            seen = rated_items(conn, user_id)
            personal = serving.recommend(user_id, k, seen)
            if personal is not None:
                return Recommendation(user_id, personal, version, "model")
            window = self.settings.popular_window
            popular = popular_items(conn, window, k + len(seen))
        unseen = set(seen)
        total = max(1, sum(count for _, count in popular))
        items = [(item, count / total) for item, count in popular if item not in unseen][:k]
        return Recommendation(user_id, items, version, "popular")

    def heartbeats(self, since_events: int = 0) -> list[dict]:
        """Stored heartbeats and those waiting for the next write, oldest first."""
        with self._lock:
            pending = [dict(row) for row in self._unsaved_heartbeats]
        with self.db.connect() as conn:
            stored = list_heartbeats(conn, since_events)
        return stored + [row for row in pending if row["events_seen"] > since_events]
