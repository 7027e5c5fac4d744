"""The stream monitor: heartbeats, the drift detector, alerts and their segments.

The learner's squared errors are grouped into heartbeats (``HEARTBEAT_EVENTS``); the
detector (``DRIFT_DETECTOR``) watches the heartbeat RMSE and raises an alert when it
rises for good. An alert is stored with where its rise comes from (new or returning
users, head or tail items) and with the id of the last event before its change, which
a drift job trains after. Heartbeats, alerts and the detector's state are written in
one transaction per batch that closes a heartbeat, so a crash of the process loses none
of them; without an alert that commit does not wait for the disk, and the next batch's
synced commit makes it durable against a crash of the machine too.

In a cluster every replica's monitor watches the whole log (each replica learns every
event in log order) but only the leader's writes: a follower's monitor is on standby,
keeping its newest heartbeats and any alert in memory, so a replica that takes over
(``take_over``) writes what the old leader had not and raises an alert it missed,
without waiting for evidence to pile up again.

Ownership: the monitor is called by the ingest path and the log tail, under the
learner's lock, and by the leadership listeners under it too; ``pending_heartbeats``
may be read from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from drift import DriftAlert, DriftDetector, Heartbeat, HeartbeatAggregator, UserKeys
from drift.event_record import ErrorRecord
from drift.segments import SegmentBuffer
from service.alerting import Notifier, drift_notice
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.store import Database
from service.store.alerts import (
    add_alert,
    add_heartbeats,
    latest_positions,
    update_alert_segments,
)
from service.store.events import labelled_id_from_end
from service.store.monitor import (
    load_monitor_state,
    load_record_errors,
    save_monitor_state,
    save_record_errors,
)
from service.stream.learner import Evaluation
from service.stream.ranking import PrequentialRanking

log = logging.getLogger(__name__)

#: Heartbeat flushes after an alert during which its segments are computed again: an
#: alert raised soon after a change has few events per user behind its top movers; a
#: few heartbeats later they stand on several times more.
SEGMENT_REFRESHES = 5
#: Heartbeats a standby monitor keeps for the moment it takes over: more than a lease
#: lasts at any rate a replica sustains.
STANDBY_HEARTBEATS = 2_000
#: A standby's alert within this many heartbeats after one the leader stored is the
#: same change seen twice, not a new one.
SAME_CHANGE_HEARTBEATS = 10


@dataclass(frozen=True)
class RaisedAlert:
    """A stored drift alert and the id of the last event before its change (None:
    the detector gave no change point)."""

    alert_id: int
    change_after_id: int | None


class StreamMonitor:
    """Heartbeats and drift alerts over the learner's prequential errors."""

    def __init__(
        self,
        db: Database,
        metrics: Metrics,
        detector: DriftDetector,
        aggregator: HeartbeatAggregator,
        ranking: PrequentialRanking,
        notifier: Notifier,
        feed: EventBuffer,
        *,
        detector_name: str,
        state_key: int,
    ) -> None:
        self.db = db
        self.metrics = metrics
        #: The drift detector (``drift.make_detector``): ``update``, ``on_swap``,
        #: ``state``, ``restore``, ``reset``.
        self.detector = detector
        self.aggregator = aggregator
        self.ranking = ranking
        self.notifier = notifier
        self.feed = feed
        self.detector_name = detector_name
        #: Row of the saved state.
        self.state_key = state_key
        #: Recent events and their errors, to say where an alert's rise comes from.
        self.segments = SegmentBuffer()
        self._user_keys = UserKeys()
        #: Labelled events counted before the aggregator's start: the detector counts
        #: from there, the service from the first stored event.
        self.events_offset = 0
        #: The serving version's heartbeats are labelled with (the newest batch's).
        self.version: str | None = None
        self._static_pending = np.empty(0)
        self._unsaved: list[dict] = []
        self._unsaved_lock = threading.Lock()
        #: Alert id → (its change, refreshes left): see ``_refresh_segments``.
        self._segment_refreshes: dict[int, tuple[int, int]] = {}
        #: Whether this replica writes heartbeats and alerts (the cluster's leader).
        self.leading = True
        #: (epoch, end) of the detector's record as the last committed write saved it,
        #: and as the write in progress does; None: saved by no write of this process.
        self._record_saved: tuple[int, int] | None = None
        self._record_written: tuple[int, int] | None = None
        self._standby: deque[dict] = deque(maxlen=STANDBY_HEARTBEATS)
        self._standby_alerts: deque[tuple[int, DriftAlert]] = deque(maxlen=16)

    # -- the ingest path --------------------------------------------------------------
    def observe(self, evaluation: Evaluation) -> list[RaisedAlert]:
        """Record a batch's errors; store the heartbeats it closed and any alert."""
        if evaluation.empty:
            return []
        self.version = evaluation.version
        errors = evaluation.squared_errors
        self._static_pending = np.concatenate(
            [self._static_pending, evaluation.static_squared_errors]
        )
        heartbeats = self.aggregator.add(errors, self._user_keys(evaluation.users))
        self.segments.record(
            evaluation.users, evaluation.items, errors, after=evaluation.labelled_before
        )
        return self._record_heartbeats(heartbeats, evaluation)

    def _record_heartbeats(
        self, heartbeats: list[Heartbeat], evaluation: Evaluation
    ) -> list[RaisedAlert]:
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
            alert = self.detector.update(beat) if evaluation.serving else None
            if not self.leading:
                self._standby.append(row)
                if alert is not None:
                    self._standby_alerts.append((row["events_seen"], alert))
                continue
            with self._unsaved_lock:
                self._unsaved.append(row)
            self.feed.publish("heartbeat", {"id": None, **row})
            if alert is not None:
                alerts.append(alert)
        if not self.leading:
            return []
        # One commit per batch that closes a heartbeat: waiting for the next batch would
        # lose the newest heartbeats to a crash, and in a drift they are the evidence.
        # Without an alert it does not wait for the disk (a crash of the process loses
        # nothing; the next batch's synced commit makes it durable against a crash of
        # the machine): an fsync of its own per batch cost more than the rest of the
        # monitor. An alert starts a job, so its commit waits for the disk.
        try:
            return self.flush(alerts, labelled_seen=evaluation.labelled_seen, synced=False)
        except SQLAlchemyError:
            log.exception(
                "could not store %d heartbeat(s) and %d drift alert(s) after a committed batch",
                len(self._unsaved),
                len(alerts),
            )
            return []

    def flush(
        self, alerts: Sequence[DriftAlert] = (), *, labelled_seen: int = 0, synced: bool = True
    ) -> list[RaisedAlert]:
        """Write the heartbeats not yet saved, the detector's state and ``alerts``.

        ``labelled_seen`` (the learner's count, the newest event's position) places the
        alerts' change points among the stored events. ``synced=False`` commits without
        waiting for the disk unless there are alerts (``Database.begin_unsynced``).
        """
        begin = self.db.begin if synced or alerts else self.db.begin_unsynced
        with begin() as conn:
            self.write_unsaved(conn, snapshot_always=True)
            self._refresh_segments(conn)
            raised = [self._store_alert(conn, alert, labelled_seen) for alert in alerts]
        self.mark_saved()
        for found, alert in zip(raised, alerts, strict=True):
            self.feed.publish(
                "alert",
                {
                    "id": found.alert_id,
                    "events_seen": self.events_offset + alert.events_seen,
                    "before": alert.before,
                    "after": alert.after,
                    "detector": alert.detector or self.detector_name,
                    "metric": alert.metric,
                },
            )
        return raised

    def write_unsaved(self, conn: Connection, *, snapshot_always: bool = False) -> None:
        """Write the unsaved heartbeats and, with them, the monitor's state, in ``conn``.

        A batch's transaction writes only heartbeats left over by a failed write (the
        state changes only when heartbeats close); ``flush`` always snapshots, so a
        clean shutdown keeps the partial heartbeat exactly. The detector's record of
        recent errors is written as it grew since the last committed write.
        """
        self._record_written = None
        with self._unsaved_lock:
            rows = list(self._unsaved)
        if not (rows or snapshot_always):
            return
        add_heartbeats(conn, rows)
        state, record = self.detector.state_apart()
        if record is not None:
            self._write_record(conn, record)
        snapshot = {
            "detector": self.detector_name,
            "monitor": state,
            "aggregator": self.aggregator.state(),
            "static_pending": self._static_pending.tolist(),
            "ranking_pending": self.ranking.pending_state(),
        }
        save_monitor_state(conn, self.state_key, self.version, snapshot)

    def _write_record(self, conn: Connection, record: ErrorRecord) -> None:
        """Save the errors ``record`` gained since the last committed write (all it
        holds when that write saved another epoch, or none is known)."""
        saved = self._record_saved
        whole = saved is None or saved[0] != record.epoch
        values, keys = record.since(record.start if saved is None or whole else saved[1])
        save_record_errors(
            conn,
            self.state_key,
            record.epoch,
            record.end - values.size,
            values,
            keys,
            held_from=record.start,
            whole=whole,
        )
        self._record_written = (record.epoch, record.end)

    def mark_saved(self) -> None:
        """The heartbeats ``write_unsaved`` wrote are committed."""
        with self._unsaved_lock:
            self._unsaved = []
        if self._record_written is not None:
            self._record_saved, self._record_written = self._record_written, None

    def pending_heartbeats(self) -> list[dict]:
        """Copies of the heartbeats not written yet, oldest first."""
        with self._unsaved_lock:
            return [dict(row) for row in self._unsaved]

    # -- leadership ---------------------------------------------------------------------
    def take_over(self, labelled_seen: int) -> list[RaisedAlert]:
        """Become the monitor that writes: store the standby heartbeats newer than the
        stored ones and an alert the standby raised that the old leader did not store,
        with the state; returns that alert for the trigger."""
        with self.db.connect() as conn:
            heartbeat_at, alert_at = latest_positions(conn)
        gap = [row for row in self._standby if row["events_seen"] > heartbeat_at]
        same_change = SAME_CHANGE_HEARTBEATS * self.aggregator.every_events
        missed = [
            alert
            for at, alert in self._standby_alerts
            if at > heartbeat_at and (alert_at is None or at > alert_at + same_change)
        ][-1:]
        with self._unsaved_lock:
            self._unsaved = gap + self._unsaved
        self._record_saved = None  # the old leader's writes replaced this process's
        self._standby.clear()
        self._standby_alerts.clear()
        self.leading = True
        log.info("drift monitor takes over: %d heartbeat(s) the leader had not written", len(gap))
        return self.flush(missed, labelled_seen=labelled_seen)

    def stand_by(self) -> None:
        """Stop writing (another replica leads); heartbeats not written are dropped,
        the new leader's standby monitor has them."""
        self.leading = False
        self.mark_saved()
        self._record_saved = None

    # -- versions ---------------------------------------------------------------------
    def on_swap(self, version: str | None, continues_regime: bool) -> None:
        """A new version serves: the detector keeps its reference only when the version
        continues the regime the serving one saw (a scheduled refresh)."""
        self.version = version
        self.detector.on_swap(continues_regime)

    def restore(self, version: str | None) -> None:
        """Carry on detecting where the previous process stopped, if it served the same
        ``version`` (a swap restarts the detector anyway).

        The aggregator's pending errors come back too; the events they cover are already
        counted in the stored events, so the offset steps back by as many. A snapshot of
        another detector (``DRIFT_DETECTOR`` changed) or one that does not fit the
        settings (``HEARTBEAT_EVENTS`` changed) is ignored: monitoring starts afresh, as
        after a swap, rather than the service refusing to start.
        """
        self.version = version
        with self.db.connect() as conn:
            saved = load_monitor_state(conn, self.state_key)
            if saved is None or saved["model_version"] != version:
                return
            state = saved["state"]
            if state.get("detector") != self.detector_name:
                log.info("drift monitor starts afresh: the saved state is another detector's")
                return
            try:
                pending = state["aggregator"]
                static_pending = np.asarray(state["static_pending"], dtype=np.float64).reshape(-1)
                if static_pending.size != int(pending["pending_count"]):
                    raise ValueError("static_pending does not match the pending heartbeat")
                self.detector.restore_apart(
                    state["monitor"], partial(load_record_errors, conn, self.state_key)
                )
                # events_seen counts from the offset; the heartbeat index carries on.
                self.aggregator.restore({**pending, "events_seen": 0})
            except (KeyError, TypeError, ValueError):
                log.warning("drift monitor starts afresh: saved state unusable", exc_info=True)
                self.detector.reset()
                return
        _, record = self.detector.state_apart()
        if record is not None and "errors" not in state["monitor"]:  # saved apart
            self._record_saved = (record.epoch, record.end)
        self.events_offset -= static_pending.size
        self._static_pending = static_pending
        self.ranking.restore_pending(state.get("ranking_pending"), static_pending.size)
        log.info("drift monitor restored from %s", saved["model_version"])

    # -- rows ---------------------------------------------------------------------------
    def _heartbeat_row(self, beat: Heartbeat, static_rmse: float) -> dict:
        self.metrics.prequential_rmse.labels(model="driftline").set(beat.rmse)
        self.metrics.prequential_rmse.labels(model="static").set(static_rmse)
        return {
            "at": time.time(),
            "events_seen": self.events_offset + beat.events_seen,
            "events": beat.events,
            "rmse": beat.rmse,
            "static_rmse": static_rmse,
            "model_version": self.version,
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

    # -- alerts -------------------------------------------------------------------------
    def _store_alert(self, conn: Connection, alert: DriftAlert, labelled_seen: int) -> RaisedAlert:
        """Store ``alert`` with where its rise comes from, and find where its change
        began for the drift job the trigger may start.

        The detector counts events from the aggregator's start; ``events_offset`` makes
        that the service's count of labelled events, the one the segment buffer's
        positions and the learner use.
        """
        self.metrics.drift_alerts.inc()
        events_seen = self.events_offset + alert.events_seen
        log.warning(
            "drift: %s %.4f -> %.4f after %d events",
            alert.metric,
            alert.before,
            alert.after,
            events_seen,
        )
        change = None if alert.change_events is None else self.events_offset + alert.change_events
        report = None if change is None else self.segments.report(change)
        alert_id = add_alert(
            conn,
            metric=alert.metric,
            before=alert.before,
            after=alert.after,
            events_seen=events_seen,
            model_version=self.version,
            detector=alert.detector or self.detector_name,
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
                events_seen=events_seen,
                model=self.version,
            )
        )
        if change is None:
            return RaisedAlert(alert_id, None)
        self._segment_refreshes[alert_id] = (change, SEGMENT_REFRESHES)
        return RaisedAlert(alert_id, _change_event_id(conn, change, labelled_seen))

    def _refresh_segments(self, conn: Connection) -> None:
        """Compute the segments of recent alerts again, on the events since their change
        (``SEGMENT_REFRESHES`` times each)."""
        for alert_id, (change, left) in list(self._segment_refreshes.items()):
            report = self.segments.report(change)
            update_alert_segments(conn, alert_id, report)
            self._export_segments(report)
            if left > 1:
                self._segment_refreshes[alert_id] = (change, left - 1)
            else:
                del self._segment_refreshes[alert_id]

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


def _change_event_id(conn: Connection, change: int, labelled_seen: int) -> int:
    """Id of the ``change``-th labelled event, the last before the change (0: none).

    Every stored labelled event has been evaluated, in id order, so the store holds
    ``labelled_seen`` of them and the one wanted is ``labelled_seen - change`` back from
    the newest: a short walk down the index, however long the history. (Where several
    consumer replicas share the store, each counts its own events and the id found is
    that much later than the change.)
    """
    if change <= 0:
        return 0
    found = labelled_id_from_end(conn, max(0, labelled_seen - change))
    return 0 if found is None else found
