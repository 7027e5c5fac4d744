"""The stream pipeline: store, then test-then-train, then drift monitoring.

Every labelled event is predicted by the model serving at that moment before it is used
for anything else (DESIGN.md §6); the squared errors are grouped into heartbeats, ADWIN
watches the heartbeat RMSE, and a confirmed alert asks the retrainer for a new version.
Versions come back through the registry: ``follow_registry`` swaps in the newest, whether
this process's retrainer or another process published it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from drift import (
    DriftAlert,
    Heartbeat,
    HeartbeatAggregator,
    PrequentialTracker,
    RankingSampler,
    make_detector,
    user_key,
)
from drift.segments import SegmentBuffer
from functions.artifacts import ArtifactError
from functions.mf import BiasedMF
from retrain import TriggerPolicy
from retrain.policies import make_policy
from service.alerting import drift_notice, make_notifier
from service.dashboard.events import EventBuffer
from service.metrics import Metrics
from service.retraining import build_retrainer
from service.serving.history import RatedItems
from service.serving.index import IndexOptions, build_index
from service.serving.model import ServingModel
from service.serving.popular import PopularItems
from service.serving.registry import LoadedVersion, ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.alerts import (
    add_alert,
    add_heartbeats,
    list_heartbeats,
    update_alert_segments,
)
from service.store.events import (
    IngestOutcome,
    NewEvent,
    count_events,
    labelled_events,
    labelled_id_from_end,
    max_event_id,
    pairs_after,
    recent_pairs,
    store_events,
)
from service.store.jobs import get_job, job_trigger
from service.store.monitor import load_monitor_state, save_monitor_state
from service.stream.ranking import PrequentialRanking

log = logging.getLogger(__name__)

#: Seconds a stopping service waits in all, for its Kafka consumer's batch and then a
#: running retraining job to finish and publish, before it exits without them (the
#: job's events are stored; a later trigger retrains on them). A supervisor's stop
#: timeout must allow this plus a flush.
RETRAIN_SHUTDOWN_GRACE_S = 30.0

#: A hot swap folds in the events stored while it replayed, round after round outside the
#: ingest lock, until a round finds at most this many; only that tail runs under the lock.
_SWAP_TAIL_EVENTS = 2_000
_SWAP_CATCH_UP_ROUNDS = 5
#: The catch-up rounds' pause between chunks of events (``ServingModel.learn``).
_FOLD_IN_PAUSE_S = 0.005
#: Triggers whose jobs start a new error regime: after a drift retrain, a first model or
#: an operator's retrain or rollback, the drift monitor learns the new version's level
#: afresh; after any other (scheduled) job it keeps its reference through the swap.
NEW_REGIME_TRIGGERS = frozenset({"drift", "bootstrap", "manual", "rollback"})

#: Heartbeat flushes after an alert during which its segments are computed again: an
#: alert raised 500 events after a change has a handful of events per user behind its
#: top movers; a few heartbeats later they stand on several times more.
_SEGMENT_REFRESHES = 5

#: Alerts whose change point (as an event id) waits for ``_trigger``; older ones are
#: dropped (an alert is triggered in the call that stored it, or never).
_CHANGES_KEPT = 64


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
        self.history = RatedItems(settings.serving_history_pairs)
        self.ranking = PrequentialRanking(
            RankingSampler(settings.ranking_sample, settings.ranking_min_rating), self.history
        )
        self.popular = PopularItems(settings.popular_window)
        self.index_options = IndexOptions(
            settings.serving_index,
            settings.serving_ann_min_items,
            settings.serving_ann_probes,
            settings.serving_ann_kept_variance,
            seed=settings.seed or 0,
            codes=settings.serving_ann_codes,
        )
        self.aggregator = HeartbeatAggregator(settings.heartbeat_events, settings.heartbeat_seconds)
        #: Recent events and their errors, to say where an alert's rise comes from.
        self.segments = SegmentBuffer()
        #: Alert id → (its change, refreshes left): see ``_refresh_segments``.
        self._segment_refreshes: dict[int, tuple[int, int]] = {}
        self._change_ids: OrderedDict[int, int] = OrderedDict()
        #: A drift alert raised while another job ran: (trigger, alert id, change point
        #: id), started as a job of its own once that one ends.
        self._deferred_drift: tuple[str, int, int] | None = None
        self._deferred_lock = threading.Lock()
        self.monitor = make_detector(
            settings.drift_detector,
            delta=settings.adwin_delta,
            min_relative_drop=settings.min_relative_drop,
            min_heartbeats=settings.min_heartbeats,
            rating_range=(settings.rating_min, settings.rating_max),
        )
        self.policy: TriggerPolicy = make_policy(
            settings.retrain_policy,
            bootstrap_events=settings.bootstrap_events,
            refresh_events=settings.refresh_events,
            interval_s=settings.retrain_interval_s,
            weight=settings.continuum_weight,
            every_events=settings.periodic_events,
        )
        #: Where notices of alerts and jobs go; started and stopped by the owner (the
        #: app's lifespan), its ``notify`` never waits on the network.
        self.notifier = make_notifier(settings, metrics)
        #: Recent heartbeats, alerts, jobs and swaps for the dashboard's live stream
        #: (``GET /dashboard/events``); publishing appends under a short lock, never waits.
        self.events = EventBuffer()
        self.retrainer = build_retrainer(
            settings,
            db,
            registry,
            metrics,
            background=background_retrain,
            notifier=self.notifier,
            events=self.events,
        )
        self._background_retrain = background_retrain
        #: Time spent building serving states for new versions (off the ingest path in
        #: the service, where the registry follower swaps; inline in benchmarks).
        self.swap_seconds = 0.0
        self._stop_following = threading.Event()
        self._follower: threading.Thread | None = None
        self.labelled_seen = 0
        self._events_offset = 0
        self._seen_at_swap = 0
        self._observed_jobs: set[int] = set()  # jobs the trigger policy has been told of
        self._static_pending = np.empty(0)
        self._unsaved_heartbeats: list[dict] = []
        #: The newest event id the history and popular items have seen, and how many
        #: events this process stored since: ``follow_events`` reads the store only when
        #: other processes stored events too.
        self._synced_event_id = 0
        self._stored_since_sync = 0
        self._lock = threading.Lock()
        #: Held while choosing and swapping in the registry's target, so a rollback and
        #: the follower never swap against each other.
        self._registry_lock = threading.Lock()

    # -- start-up ---------------------------------------------------------------
    def restore(self) -> None:
        """Resume after a restart: newest verified version, fold-in replayed, clocks restored."""
        with self.db.connect() as conn:
            # Every stored labelled event was evaluated right after its commit.
            self._events_offset = count_events(conn, labelled_only=True)
        self.labelled_seen = self._events_offset
        oldest = self.registry.oldest_loadable()
        self.static = oldest.model if oldest else None
        with self.db.connect() as conn:
            self._synced_event_id = max_event_id(conn)
        with self.db.connect() as conn:
            users, items = recent_pairs(conn, self.settings.serving_history_pairs)
        self.history.add(users, items)
        with self.db.connect() as conn:
            self.popular.add(*recent_pairs(conn, self.settings.popular_window))
        newest = self.registry.target_loadable()
        if newest is not None:
            self.swap(newest)
            self._restore_monitor()
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
        so a failure there can never lose an acknowledged event. Heartbeats the batch
        closed are written at once with the drift monitor's state (and any alert), so a
        crash loses none of them; if that write fails they ride along with the next
        batch's transaction. ``also_write`` runs inside the same transaction as the
        batch (the Kafka consumer records its offsets there).
        """
        with self._lock:
            with self.db.begin() as conn:
                outcome = store_events(conn, batch)
                if also_write is not None:
                    also_write(conn)
                self._save_heartbeats(conn)
            self._unsaved_heartbeats = []
            alerts = self._evaluate_and_learn(outcome.stored)
            stored = outcome.stored
            self.popular.add([e.user_id for e in stored], [e.item_id for e in stored])
            self._stored_since_sync += len(stored)
            self.policy.observe_events(sum(e.rating is not None for e in stored), time.time())
        self.metrics.events_ingested.inc(outcome.accepted)
        self.metrics.events_duplicate.inc(outcome.duplicates)
        try:
            self._trigger(alerts)
        except SQLAlchemyError:
            # The batch is committed; answering with an error would invite a retry of
            # data already stored. The next alert or progress check triggers again.
            log.exception("could not start a retraining job; the ingested batch is stored")
        if not self._background_retrain and self.retrainer.published.is_set():
            self.follow_registry()  # a job ran inline: serve what it published now
        return outcome

    def _evaluate_and_learn(self, stored: Sequence[NewEvent]) -> list[int]:
        view = self.serving.view  # the items as the batch found them, for ranking
        labelled = [e for e in stored if e.rating is not None]
        if not labelled:
            self.ranking.rank(stored, view, self.static)
            return []
        users = [e.user_id for e in labelled]
        items = [e.item_id for e in labelled]
        ratings = np.fromiter((e.rating for e in labelled), dtype=np.float64, count=len(labelled))
        predicted, vectors = self.serving.predict_then_learn_vectors(users, items, ratings)
        self.ranking.rank(stored, view, self.static, vectors)
        static = self._static_predict(users, items, predicted)
        self.tracker.record("driftline", ratings, predicted)
        self.tracker.record("static", ratings, static)
        self._static_pending = np.concatenate([self._static_pending, (ratings - static) ** 2])
        keys = np.fromiter((user_key(user) for user in users), dtype=np.uint16, count=len(users))
        heartbeats = self.aggregator.add((ratings - predicted) ** 2, keys)
        self.segments.record(users, items, (ratings - predicted) ** 2, after=self.labelled_seen)
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
            row.update(self._ranking_row(beat.events))
            self._unsaved_heartbeats.append(row)
            self.events.publish("heartbeat", {"id": None, **row})
            alert = self.monitor.update(beat) if self.current is not None else None
            if alert is not None:
                alerts.append(alert)
        # One commit per batch that closes a heartbeat: waiting for the next batch would
        # lose the newest heartbeats to a crash, and in a drift they are the evidence.
        try:
            return self.flush(alerts)
        except SQLAlchemyError:
            log.exception(
                "could not store %d heartbeat(s) and %d drift alert(s) after a committed batch",
                len(self._unsaved_heartbeats),
                len(alerts),
            )
            return []

    def flush(self, alerts: Sequence[DriftAlert] = ()) -> list[int]:
        """Write heartbeats not yet saved, and ``alerts``; returns the alerts' ids."""
        with self.db.begin() as conn:
            self._save_heartbeats(conn, snapshot_always=True)
            self._refresh_segments(conn)
            alert_ids = [self._store_alert(conn, alert) for alert in alerts]
        self._unsaved_heartbeats = []
        for alert_id, alert in zip(alert_ids, alerts, strict=True):
            self.events.publish(
                "alert",
                {
                    "id": alert_id,
                    "events_seen": self._events_offset + alert.events_seen,
                    "before": alert.before,
                    "after": alert.after,
                    "detector": alert.detector or self.settings.drift_detector,
                    "metric": alert.metric,
                },
            )
        return alert_ids

    def _export_segments(self, report: dict[str, Any] | None) -> None:
        """The newest alert's split of the rise, per segment, for Prometheus."""
        if report is None:
            return
        for side, segment in (
            ("users", "new"),
            ("users", "returning"),
            ("items", "head"),
            ("items", "tail"),
        ):
            share = report[side][segment].get("share_of_rise")
            if share is not None:
                self.metrics.drift_segment_share.labels(f"{segment}_{side}").set(share)

    def _refresh_segments(self, conn: Connection) -> None:
        """Compute the segments of recent alerts again, on the events since their change
        (``_SEGMENT_REFRESHES`` times each)."""
        for alert_id, (change, left) in list(self._segment_refreshes.items()):
            report = self.segments.report(change)
            update_alert_segments(conn, alert_id, report)
            self._export_segments(report)
            if left > 1:
                self._segment_refreshes[alert_id] = (change, left - 1)
            else:
                del self._segment_refreshes[alert_id]

    def _save_heartbeats(self, conn: Connection, *, snapshot_always: bool = False) -> None:
        """Write the unsaved heartbeats and, with them, the monitor's state.

        A batch's transaction writes only heartbeats left over by a failed write (the
        monitor changes only when heartbeats close); ``flush`` always snapshots, so a
        clean shutdown keeps the partial heartbeat exactly.
        """
        if not (self._unsaved_heartbeats or snapshot_always):
            return
        add_heartbeats(conn, self._unsaved_heartbeats)
        snapshot = {
            "detector": self.settings.drift_detector,
            "monitor": self.monitor.state(),
            "aggregator": self.aggregator.state(),
            "static_pending": self._static_pending.tolist(),
            "ranking_pending": self.ranking.pending_state(),
        }
        save_monitor_state(conn, self.settings.kafka_replica, self.serving.version, snapshot)

    def _restore_monitor(self) -> None:
        """Carry on detecting where the previous process stopped, if it served the same
        version (a swap restarts the monitor anyway).

        The aggregator's pending errors come back too; the events they cover are already
        counted in the stored events, so the offset steps back by as many. A snapshot of
        another detector (``DRIFT_DETECTOR`` changed) or one that does not fit the
        settings (``HEARTBEAT_EVENTS`` changed) is ignored: monitoring starts afresh, as
        after a swap, rather than the service refusing to start.
        """
        with self.db.connect() as conn:
            saved = load_monitor_state(conn, self.settings.kafka_replica)
        if saved is None or saved["model_version"] != self.serving.version:
            return
        state = saved["state"]
        if state.get("detector") != self.settings.drift_detector:
            log.info("drift monitor starts afresh: the saved state is another detector's")
            return
        try:
            pending = state["aggregator"]
            static_pending = np.asarray(state["static_pending"], dtype=np.float64).reshape(-1)
            if static_pending.size != int(pending["pending_count"]):
                raise ValueError("static_pending does not match the pending heartbeat")
            self.monitor.restore(state["monitor"])
            # events_seen counts from the offset; the heartbeat index carries on.
            self.aggregator.restore({**pending, "events_seen": 0})
        except (KeyError, TypeError, ValueError):
            log.warning("drift monitor starts afresh: saved state unusable", exc_info=True)
            self.monitor.reset()
            return
        self._events_offset -= static_pending.size
        self._static_pending = static_pending
        self.ranking.restore_pending(state.get("ranking_pending"), static_pending.size)
        log.info("drift monitor restored from %s", saved["model_version"])

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

    def _ranking_row(self, events: int) -> dict:
        """The heartbeat's ranking figures; the gauges keep the newest that ranked any."""
        figures = self.ranking.take(events)
        for model, prefix in (("driftline", ""), ("static", "static_")):
            if figures[f"{prefix}hit_rate"] is not None:
                self.metrics.prequential_hit_rate.labels(model=model).set(
                    figures[f"{prefix}hit_rate"]
                )
                self.metrics.prequential_ndcg.labels(model=model).set(figures[f"{prefix}ndcg"])
        return figures

    def _store_alert(self, conn: Connection, alert: DriftAlert) -> int:
        """Store ``alert`` with where its rise comes from, and remember where its change
        began for the drift job ``_trigger`` may start.

        The detector counts events from the aggregator's start; ``_events_offset`` makes
        that the service's count of labelled events, the one the segment buffer's
        positions and ``labelled_seen`` use.
        """
        self.metrics.drift_alerts.inc()
        log.warning(
            "drift: %s %.4f -> %.4f after %d events",
            alert.metric,
            alert.before,
            alert.after,
            self._events_offset + alert.events_seen,
        )
        change = None if alert.change_events is None else self._events_offset + alert.change_events
        report = None if change is None else self.segments.report(change)
        alert_id = add_alert(
            conn,
            metric=alert.metric,
            before=alert.before,
            after=alert.after,
            events_seen=self._events_offset + alert.events_seen,
            model_version=self.serving.version,
            detector=alert.detector or self.settings.drift_detector,
            change_events=change,
            segments=report,
        )
        self._export_segments(report)
        self.notifier.notify(
            drift_notice(
                alert_id,
                metric=alert.metric,
                before=alert.before,
                after=alert.after,
                events_seen=self._events_offset + alert.events_seen,
                model=self.serving.version,
            )
        )
        if change is not None:
            self._segment_refreshes[alert_id] = (change, _SEGMENT_REFRESHES)
            self._change_ids[alert_id] = self._change_event_id(conn, change)
            while len(self._change_ids) > _CHANGES_KEPT:
                self._change_ids.popitem(last=False)
        return alert_id

    def _change_event_id(self, conn: Connection, change: int) -> int:
        """Id of the ``change``-th labelled event, the last before the change (0: none).

        Every stored labelled event has been evaluated, in id order, so the store holds
        ``labelled_seen`` of them and the one wanted is ``labelled_seen - change`` back
        from the newest: a short walk down the index, however long the history. (Where
        several consumer replicas share the store, each counts its own events and the
        id found is that much later than the change.)
        """
        if change <= 0:
            return 0
        found = labelled_id_from_end(conn, max(0, self.labelled_seen - change))
        return 0 if found is None else found

    def _trigger(self, alert_ids: list[int]) -> None:
        if not self.settings.retrain_enabled:
            return
        for alert_id in alert_ids:
            change_after_id = self._change_ids.pop(alert_id, None)
            trigger = self.policy.on_alert()
            if trigger is None:
                continue
            if self.retrainer.active_job_id is not None and change_after_id is not None:
                # The running job's window predates the change: train on the change as
                # soon as it ends, rather than call that job the answer to the alert; a
                # scheduled job is cut short at its next epoch (DRIFT_PREEMPTS_JOBS).
                with self._deferred_lock:
                    self._deferred_drift = (trigger, alert_id, change_after_id)
                if self.settings.drift_preempts_jobs:
                    self.retrainer.preempt(f"pre-empted by drift alert {alert_id}")
                continue
            self.retrainer.request(
                trigger, alert_id, base=self.current, change_after_id=change_after_id
            )
        self._start_deferred_drift()
        if self.retrainer.active_job_id is None:
            since = None if self.current is None else self.labelled_seen - self._seen_at_swap
            trigger = self.policy.on_progress(self.labelled_seen, since)
            if trigger is not None and not self._version_on_its_way():
                self.retrainer.request(trigger, base=self.current)

    def _version_on_its_way(self) -> bool:
        """Whether a version is published but not serving yet: a job of this process
        published it and its swap is pending or running, or nothing serves and one
        exists (a bootstrap job just finished).

        A scheduled job started meanwhile would build on the version being replaced and
        count its window from it, and a second bootstrap would train the same window
        again. The policy asks again after the next batch, counting from the new
        version. It also keeps a job's window build off the swap's catch-up, the two
        heaviest pieces of retraining work beside ``/recommend`` (bench serve).
        """
        if self.retrainer.published.is_set() or self._registry_lock.locked():
            return True
        if self.current is not None:
            return False
        try:
            return bool(self.registry.versions(include_deleted=False))
        except SQLAlchemyError:
            log.exception("reading the registry before a bootstrap job")
            return False

    def _start_deferred_drift(self) -> None:
        """Start the drift job an alert asked for while another job ran, if none runs now.

        Called after each batch and whenever a job publishes, so the drift job starts
        when the job before it ends, whether or not events keep arriving.
        """
        with self._deferred_lock:
            if self._deferred_drift is None or self.retrainer.active_job_id is not None:
                return
            trigger, alert_id, change_after_id = self._deferred_drift
            self._deferred_drift = None
        self.retrainer.request(
            trigger, alert_id, base=self.current, change_after_id=change_after_id
        )

    def retrain_now(self, trigger: str = "manual") -> int:
        """Start a job by hand from the serving version; ``JobAlreadyRunning`` if one runs."""
        job_id = self.retrainer.request(trigger, None, base=self.current, exclusive=True)
        if not self._background_retrain:
            self.follow_registry()
        return job_id

    # -- model versions -----------------------------------------------------------
    def swap(self, loaded: LoadedVersion, trigger: str | None = None) -> None:
        """Serve ``loaded`` from now on, with fold-in of everything it has not seen.

        ``trigger`` says why when it is not the version's job (``rollback``): the drift
        monitor starts afresh after a swap in ``NEW_REGIME_TRIGGERS``.

        The fold-in starts ``fold_in_replay_events`` before the version's last event:
        the version knows each user's long-run taste, the fold-in their latest ratings,
        which a version trained on everything averages away. The replay, and then the
        events stored while it ran, are folded in outside the lock so ingestion keeps
        flowing; only a tail of at most ``_SWAP_TAIL_EVENTS`` events (those stored in
        the last catch-up round) is folded in under the lock, just before the switch.
        The version's item index (``SERVING_INDEX``) is built before that, outside the
        lock too: requests go on being served by the old version meanwhile.
        """
        began = time.perf_counter()
        why = trigger or self._job_trigger(loaded)  # also the dashboard's swap event's
        continues_regime = self._continues_regime(why, explicit=trigger is not None)
        serving = self._serving_for(loaded)
        caught_up_to = max(0, loaded.last_event_id - self.settings.fold_in_replay_events)
        for _round in range(_SWAP_CATCH_UP_ROUNDS):
            caught_up_to, folded = self._fold_in_since(serving, caught_up_to, _FOLD_IN_PAUSE_S)
            if folded <= _SWAP_TAIL_EVENTS:
                break
        self._index_items(serving)
        with self._lock:
            self._fold_in_since(serving, caught_up_to)
            self.serving = serving
            self.current = loaded
            self._seen_at_swap = self.labelled_seen
            if self.static is None:
                self.static = loaded.model
            self.monitor.on_swap(continues_regime)
            events_seen = self.labelled_seen
        self.swap_seconds += time.perf_counter() - began
        self.events.publish(
            "swap", {"version": loaded.version, "events_seen": events_seen, "trigger": why}
        )
        self._observe_job(loaded)
        self.metrics.model_swaps.inc()
        log.info("serving model %s", loaded.version)

    def _observe_job(self, loaded: LoadedVersion) -> None:
        """Tell the policy how long the job behind ``loaded`` ran, over how many events,
        once per job: Continuum's rule refits its training-time model on these."""
        job_id = loaded.row.get("job_id")
        if job_id is None or int(job_id) in self._observed_jobs:
            return  # a rollback or a second swap of one version is not a new job
        self._observed_jobs.add(int(job_id))
        try:
            with self.db.connect() as conn:
                job = get_job(conn, int(job_id))
        except SQLAlchemyError:
            log.exception("reading job %s for the trigger policy", job_id)
            return
        if job is None or job.get("finished_at") is None or job.get("started_at") is None:
            return
        if job.get("window_events"):
            self.policy.observe_job(job["window_events"], job["finished_at"] - job["started_at"])

    def accuracy_summary(self) -> dict[str, dict[str, Any]]:
        """Running RMSE and, beside it, hit-rate@10 and NDCG@10 per model (``/healthz``,
        the dashboard's overview)."""
        ranking = self.ranking.tracker
        return {
            track: {
                **stats,
                "hit_rate": ranking.hit_rate(track),
                "ndcg": ranking.ndcg(track),
                "ranked_events": ranking.count(track),
            }
            for track, stats in self.tracker.summary().items()
        }

    def policy_status(self) -> dict[str, str]:
        """The trigger policy's name and what it waits for, for ``/healthz``."""
        since = None if self.current is None else self.labelled_seen - self._seen_at_swap
        return {
            "name": self.policy.name,
            "waiting_for": self.policy.waiting_for(self.labelled_seen, since),
        }

    def _continues_regime(self, trigger: str | None, *, explicit: bool) -> bool:
        """Whether a version swapped in for ``trigger`` was trained on a schedule over
        the stream the serving version saw (the monitor keeps its reference), rather
        than after a drift alert, as the first model, by hand or rolled back to (the
        monitor starts afresh). A trigger read from the version's job (not ``explicit``)
        continues nothing while no version serves, nor when the store cannot say."""
        if trigger is None or (not explicit and self.current is None):
            return False
        return trigger not in NEW_REGIME_TRIGGERS

    def _job_trigger(self, loaded: LoadedVersion) -> str | None:
        """What started the job that trained ``loaded``; None without a job, or when
        the store cannot say."""
        job_id = loaded.row.get("job_id")
        if job_id is None:
            return None
        try:
            with self.db.connect() as conn:
                return job_trigger(conn, int(job_id))
        except SQLAlchemyError:
            log.exception("reading the trigger of job %s", job_id)
            return None

    def _index_items(self, serving: ServingModel) -> None:
        """Build the item index ``SERVING_INDEX`` asks for and hand it to ``serving``."""
        model = serving.model
        if model is None:
            return
        index = build_index(model.item_factors, serving.view.item_bias, self.index_options)
        serving.attach_index(index)
        if index is not None:
            log.info(
                "%s index of %d items for %s built in %.1f s",
                index.name,
                index.n_items,
                serving.version,
                index.build_seconds,
            )

    def _fold_in_since(
        self, serving: ServingModel, after_id: int, pause_s: float = 0.0
    ) -> tuple[int, int]:
        """Fold the labelled events stored after ``after_id`` into ``serving``, pausing
        ``pause_s`` between chunks (``ServingModel.learn``).

        Returns the id caught up to and how many events were folded in.
        """
        with self.db.connect() as conn:
            events = labelled_events(conn, after_id=after_id)
        serving.learn(events.user_ids, events.item_ids, events.ratings, pause_s)
        return (int(events.ids[-1]) if len(events) else after_id), len(events)

    def swap_to(self, version: str, trigger: str | None = None) -> bool:
        """Load ``version`` from the registry and serve it; a bad artifact keeps the old one."""
        try:
            loaded = self.registry.load(version)
        except ArtifactError as exc:
            self.metrics.model_load_failures.inc()
            log.error("refusing model %s: %s; still serving %s", version, exc, self.serving.version)
            return False
        self.swap(loaded, trigger)
        return True

    def follow_registry(self) -> bool:
        """Serve the registry's target if another process published or rolled back to it.

        Consumer replicas and servers that share a database also share versions: a
        version published anywhere, or a rollback made anywhere, is picked up here
        (``service.serving.timeline``). Returns whether it swapped.
        """
        self.retrainer.published.clear()
        with self._registry_lock:
            change = self.registry.target()
            if change is None or change.version == self.serving.version:
                return False
            current = self.current
            if change.trigger == "publish" and current and change.at <= current.row["created_at"]:
                return False
            trigger = "rollback" if change.trigger == "rollback" else None
            swapped = self.swap_to(change.version, trigger)
        if swapped:
            self._apply_retention()
        return swapped

    def rollback(self, version: str, actor: str) -> dict[str, Any]:
        """Serve the earlier ``version`` again, recorded as ``actor``'s rollback.

        Verified before it is recorded, swapped in before this returns; the drift
        monitor treats it as a new regime. Rolling back to the version served before
        undoes it. ``RollbackRefused`` (404, 409) when it cannot be done.
        """
        with self._registry_lock:
            serving = self.serving.version
            loaded = self.registry.rollback_target(version, serving)
            record = self.registry.record_rollback(version, actor=actor, from_version=serving)
            self.swap(loaded, trigger="rollback")
        self.metrics.model_rollbacks.inc()
        return record

    def _apply_retention(self) -> None:
        """Delete old versions' artifacts, keeping the serving one, the never-retrained
        baseline (the static track predicts with it for as long as the service runs) and
        those running jobs build on (here or in another process sharing the database)."""
        try:
            protected = {self.serving.version, *self.retrainer.protected_versions()}
            oldest = self.registry.versions(include_deleted=False)[-1:]
            protected.update(row["version"] for row in oldest)
            self.registry.prune(self.settings.retention_versions, {v for v in protected if v})
        except SQLAlchemyError:
            log.exception("could not apply model retention; the next swap tries again")

    def start_following(self, every: float | None) -> None:
        """Follow the registry on a thread: at once when this process's retrainer
        publishes, and every ``every`` seconds for versions other processes publish."""
        if self._follower is not None:
            return
        self._follower = threading.Thread(
            target=self._follow, args=(every,), name="registry-follower", daemon=True
        )
        self._follower.start()

    def stop_following(self) -> None:
        self._stop_following.set()
        if self._follower is not None:
            self._follower.join(timeout=30)
            self._follower = None

    def shut_down(self, grace_s: float = RETRAIN_SHUTDOWN_GRACE_S) -> None:
        """Stop once nothing feeds it any more: a running retraining job gets
        ``grace_s`` to publish (what is left of ``RETRAIN_SHUTDOWN_GRACE_S`` once
        whatever fed it has stopped), the heartbeats not yet saved are written, the
        workers' processes stop and notifications stop.

        The heartbeats are written before the runtimes close: closing waits for the
        invocations in flight, which a job past its grace still has, and a supervisor
        kills the process when its stop timeout runs out.
        """
        self.retrainer.wait(timeout=max(0.0, grace_s))
        self.flush()
        self.retrainer.close()
        self.notifier.stop()

    def _follow(self, every: float | None) -> None:
        published, polled = self.retrainer.published, time.monotonic()
        while not self._stop_following.is_set():
            published.wait(timeout=0.2)
            if self._deferred_drift is not None and self.settings.retrain_enabled:
                try:
                    self._start_deferred_drift()
                except Exception:  # the next batch tries again
                    log.exception("could not start the deferred drift job")
            due = every is not None and time.monotonic() - polled >= every
            if not (published.is_set() or due):
                continue
            polled = time.monotonic()
            try:
                self.follow_registry()
                self.follow_events()
            except Exception:  # a failed look must not end the loop; the next one may work
                log.exception("could not check the registry or the events for news")

    def follow_events(self) -> bool:
        """Take in the events other processes (Kafka consume replicas) stored since the
        last look: their users' rated items join the history, and the popular items are
        recounted from the store. Returns whether there were any.

        Events this process ingests are in both at once; other processes' events reach
        them here, at each registry poll (``REGISTRY_POLL_SECONDS``), as their ratings
        reach the fold-in at each swap. Under the ingest lock, so that the count of this
        process's own events since the last look is exact.
        """
        with self._lock:
            with self.db.connect() as conn:
                newest = max_event_id(conn)
                foreign = newest - self._synced_event_id > self._stored_since_sync
                if foreign:
                    limit = self.settings.serving_history_pairs
                    users, items = pairs_after(conn, self._synced_event_id, limit)
                    window = recent_pairs(conn, self.settings.popular_window)
            self._synced_event_id, self._stored_since_sync = newest, 0
            if not foreign:
                return False
            self.history.add(users, items)
            popular = PopularItems(self.settings.popular_window)
            popular.add(*window)
            self.popular = popular
        return True

    def _serving_for(self, loaded: LoadedVersion | None) -> ServingModel:
        return ServingModel(
            loaded.model if loaded else None,
            loaded.version if loaded else None,
            regularization=self.settings.fold_in_regularization,
            bias_regularization=self.settings.fold_in_bias_regularization,
            item_bias_regularization=self.settings.fold_in_item_bias_regularization,
            ranking_item_bias_regularization=self.settings.ranking_item_bias_regularization,
            scale_regularization=self.settings.fold_in_scale_regularization,
            forgetting=self.settings.fold_in_forgetting,
            rating_range=(self.settings.rating_min, self.settings.rating_max),
            max_users=self.settings.serving_max_users,
            max_items=self.settings.serving_max_items,
            cached_answers=self.settings.serving_cached_answers,
            answer_max_age_s=self.settings.serving_answer_max_age_s,
        )

    # -- serving --------------------------------------------------------------------
    @property
    def recommend_is_quick(self) -> bool:
        """Whether ``recommend`` costs well under a millisecond now: an item index
        serves it, or the catalogue is below the size that would get one."""
        view = self.serving.view
        items = 0 if view.model is None else view.model.n_items
        return view.index is not None or items < self.index_options.min_items

    @property
    def recommend_searches_index(self) -> bool:
        """Whether ``recommend`` asks an item index now (which searches without
        holding the interpreter) rather than scoring the catalogue."""
        return self.serving.view.index is not None

    def recommend(self, user_id: str, k: int) -> Recommendation:
        """Top-``k`` unseen items; users the model cannot place get what is popular now.

        Lock-free and without I/O: the serving model's published view, the user's rated
        items and the popular ranking are in-memory snapshots that ingestion replaces
        whole, each taken once. An acknowledged event is in all three before ``ingest``
        returns, so the user's next request reflects it. The items and the version named
        in the answer always belong together, whatever swap or batch happens meanwhile.
        """
        return self.recommend_many([(user_id, k)])[0]

    def recommend_many(self, asked: Sequence[tuple[str, int]]) -> list[Recommendation]:
        """``recommend`` of each (user, k), from one view: one index search for all."""
        view = self.serving.view
        version = view.version or "none"
        seen = [self.history.items(user_id) for user_id, _ in asked]
        personal = view.recommend_many(
            [(user_id, k, items) for (user_id, k), items in zip(asked, seen, strict=True)]
        )
        return [
            Recommendation(user_id, answer, version, "model")
            if answer is not None
            else Recommendation(user_id, self.popular.top(k, items), version, "popular")
            for (user_id, k), items, answer in zip(asked, seen, personal, strict=True)
        ]

    def heartbeats(self, since_events: int = 0) -> list[dict]:
        """Stored heartbeats and those waiting for the next write, oldest first."""
        with self._lock:
            pending = [dict(row) for row in self._unsaved_heartbeats]
        with self.db.connect() as conn:
            stored = list_heartbeats(conn, since_events)
        return stored + [row for row in pending if row["events_seen"] > since_events]
