"""The composition root: every component of a Driftline process, built in one place.

``build_driftline`` turns settings into the components, each handed what it needs, in
the streaming order: the event writer, the learner, the stream monitor, the retrain
trigger, then the serving side (the version swapper, its registry follower, the
recommender), the cluster's parts (the leadership, the log tail) and the read models.
``Driftline`` holds them for ``serve``, ``consume``, the benchmarks and the tests, and
passes the event log along the path.

The path applies the log, the events table in id order, whoever stored the events: a
batch this replica stores is learnt after the events other replicas stored before it,
and the log tail applies the rest as it appears. So every replica learns the same
events in the same order; the leader's monitor writes and its trigger starts jobs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from drift import DriftDetector, HeartbeatAggregator, RankingSampler, make_detector
from functions.objectstore import open_object_store
from retrain import TriggerPolicy
from retrain.lifecycle import Retrainer
from retrain.policies import make_policy
from service.alerting import Notifier, make_notifier
from service.cluster.identity import default_replica_id
from service.cluster.leadership import Leadership
from service.cluster.logtail import LogTail
from service.collector import tune_collector
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.reads import StreamReads
from service.retraining import build_retrainer
from service.rollout.follower import RegistryFollower
from service.rollout.guard import RolloutGuard
from service.rollout.rule import GuardOptions
from service.rollout.swapper import VersionSwapper
from service.serving.builder import FoldInOptions, ServingBuilder
from service.serving.history import RatedItems
from service.serving.index import IndexOptions
from service.serving.recommender import Recommender
from service.serving.registry import LoadedVersion, ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.eventlog import EventLog
from service.store.events import IngestOutcome, NewEvent, log_after, max_event_id
from service.store.retention import Archiver, RetentionOptions
from service.stream.coalescing import CoalescingIngest
from service.stream.feed_relay import StoredFeedRelay
from service.stream.learner import Learner
from service.stream.monitor import RaisedAlert, StreamMonitor
from service.stream.ranking import PrequentialRanking
from service.stream.requests import RetrainRequests
from service.stream.snapshot import SnapshotStore, SnapshotWriter, restore_from_snapshot
from service.stream.trigger import RetrainTrigger
from service.stream.warmup import start_warm_up
from service.stream.writer import EventWriter, StoreFailed

log = logging.getLogger(__name__)

#: Seconds a stopping service waits in all, for its Kafka consumer's batch and then a
#: running retraining job to finish and publish, before it exits without them (the
#: job's events are stored; a later trigger retrains on them). A supervisor's stop
#: timeout must allow this plus a flush.
RETRAIN_SHUTDOWN_GRACE_S = 30.0
#: Events of the log read and applied at a time by the log tail.
LOG_PAGE_EVENTS = 5_000

#: What a process does: everything (``all``); only serve and fold the log in
#: (``serving``, beside a ``stream`` process when ``STREAM_PROCESS`` is set); or the rest,
#: evaluation, the drift monitor, the trigger and jobs, as a leader candidate
#: (``stream``).
Role = Literal["all", "serving", "stream"]


@dataclass
class Driftline:
    """One process's components, and the path an ingested batch takes through them."""

    settings: Settings
    db: Database
    registry: ModelRegistry
    metrics: Metrics
    notifier: Notifier
    feed: EventBuffer
    retrainer: Retrainer
    writer: EventWriter
    learner: Learner
    monitor: StreamMonitor
    trigger: RetrainTrigger
    swapper: VersionSwapper
    follower: RegistryFollower
    recommender: Recommender
    reads: StreamReads
    leadership: Leadership
    tail: LogTail
    #: Whether jobs run on threads of their own (the service) or inline (benchmarks).
    background_retrain: bool = True
    #: Snapshots of the online state: written by the leader, read by ``restore``.
    snapshots: SnapshotWriter | None = None
    #: The log across the archive and the table, for a replica behind the archive.
    event_log: EventLog | None = None
    #: Moves the events past ``EVENT_RETENTION`` to the archive, while leading.
    archiver: Archiver | None = None
    #: Set once the learning path's compiled kernels are loaded (``service.stream.warmup``);
    #: benchmarks wait for it before they time the path.
    kernels_ready: threading.Event = field(default_factory=threading.Event)
    #: Runs published versions in shadow and decides their promotion (``GUARD_ENABLED``).
    guard: RolloutGuard | None = None
    #: ``ingest`` for concurrent callers (``POST /ingest``): batches queued while one is
    #: stored and learnt go together (``service.stream.coalescing``); set by ``assemble``.
    coalescing: CoalescingIngest | None = None

    # -- the ingest path ----------------------------------------------------------------
    def ingest(
        self,
        batch: Sequence[NewEvent],
        also_write: Callable[[Connection], None] | None = None,
    ) -> IngestOutcome:
        """Store ``batch`` atomically, then evaluate and learn from the new events.

        The batch is durable before this returns; evaluation happens after the commit,
        so a failure there can never lose an acknowledged event. Events other replicas
        stored before the batch are learnt first, so this replica's answers reflect the
        batch at once and the log's order holds. Heartbeats the batch closed are
        written at once with the monitor's state (and any alert); if that write fails
        they ride along with the next batch's transaction. ``also_write`` runs inside
        the batch's transaction (the Kafka consumer records its offsets).
        """
        try:
            return self.ingest_all([batch], also_write)[0]
        except StoreFailed as failed:
            raise failed.__cause__ or failed from None

    def ingest_all(
        self,
        batches: Sequence[Sequence[NewEvent]],
        also_write: Callable[[Connection], None] | None = None,
    ) -> list[IngestOutcome]:
        """``ingest`` of several batches: stored in one transaction, in order, and learnt
        as one batch; one outcome each (``EventWriter.store_all``).

        Raises ``StoreFailed`` when the transaction failed (nothing was stored), and
        whatever learning raised once the batches were stored.
        """
        if not batches:
            return []
        writes = [w for w in (also_write, self.monitor.write_unsaved) if w is not None]
        with self.learner.lock:
            outcomes = self.writer.store_all(batches, *writes)
            self.monitor.mark_saved()
            alerts = self._apply_log(up_to=outcomes[0].log_before)
            stored = [event for outcome in outcomes for event in outcome.stored]
            alerts += self._learn(stored, outcomes[-1].position)
        for outcome in outcomes:
            self.writer.count(outcome)
        self._after_learning(alerts)
        return outcomes

    def catch_up(self) -> int:
        """Apply the events other replicas stored since this one last looked (the log
        tail's step); returns the position applied."""
        with self.learner.lock:
            alerts = self._apply_log(up_to=None)
            position = self.learner.applied
        self._after_learning(alerts)
        return position

    def _apply_log(self, up_to: int | None) -> list[RaisedAlert]:
        """Learn the stored log after the applied position, up to ``up_to`` (None: all
        of it), a page at a time; under the learner's lock."""
        alerts: list[RaisedAlert] = []
        while up_to is None or self.learner.applied < up_to:
            with self.db.connect() as conn:
                if self.event_log is None:
                    batches = log_after(conn, self.learner.applied, up_to, LOG_PAGE_EVENTS)
                else:
                    batches = self.event_log.log_after(
                        conn, self.learner.applied, up_to, LOG_PAGE_EVENTS
                    )
            if not batches:
                # Ids the log skipped (a duplicate's or a rolled-back insert's) end here.
                if up_to is not None:
                    self.learner.applied = up_to
                break
            for batch in batches:  # each as the replica that stored it learnt it
                alerts += self._learn(batch.events, batch.position)
        return alerts

    def _learn(self, events: Sequence[NewEvent], position: int) -> list[RaisedAlert]:
        evaluation = self.learner.learn(events, position)
        alerts = self.monitor.observe(evaluation)
        self.trigger.observe_events(len(evaluation.users))
        if self.guard is not None:
            self.guard.observe(evaluation)
        return alerts

    def _after_learning(self, alerts: list[RaisedAlert]) -> None:
        try:
            self.trigger.after_batch(alerts)
        except SQLAlchemyError:
            # The batch is committed; answering with an error would invite a retry of
            # data already stored. The next alert or progress check triggers again.
            log.exception("could not start a retraining job; the ingested batch is stored")
        if self.guard is not None:
            self.guard.act()
        self._serve_inline_publication()

    def retrain_now(self, trigger: str = "manual") -> int:
        """Start a job by hand from the serving version; ``JobAlreadyRunning`` if one runs."""
        job_id = self.trigger.retrain_now(trigger)
        self._serve_inline_publication()
        return job_id

    def _serve_inline_publication(self) -> None:
        """A job that ran inline published: serve its version now (or, guarded, run
        it in shadow)."""
        if not self.background_retrain and self.retrainer.published.is_set():
            self.swapper.follow_registry()
            if self.guard is not None:
                self.guard.follow()

    # -- leadership ----------------------------------------------------------------------
    def _take_lead(self, token: int) -> None:
        """This replica leads now: its monitor writes from where the old leader's
        stopped, interrupted jobs resume, and an alert the old leader missed is answered."""
        self.metrics.leader.set(1)
        with self.learner.lock:
            alerts = self.monitor.take_over(self.learner.labelled_seen)
        self.retrainer.resume_interrupted()
        self._after_learning(alerts)

    def _stand_by(self) -> None:
        """Another replica leads (or this one stops): stop writing and starting jobs; a
        running job stops after its epoch in flight (the new leader resumes it)."""
        self.metrics.leader.set(0)
        with self.learner.lock:
            self.monitor.stand_by()
        if self.guard is not None:
            self.guard.stand_by()
        self.retrainer.preempt("this replica no longer leads the cluster", force=True)

    # -- life cycle ----------------------------------------------------------------------
    def restore(self) -> None:
        """Resume after a restart: newest verified version, fold-in replayed, the
        monitor where it stopped; then claim the lead, which resumes interrupted jobs."""
        oldest = self.registry.oldest_loadable()
        self.learner.restore(oldest.model if oldest else None)
        self.monitor.events_offset = self.learner.labelled_seen
        newest = self.registry.target_loadable()
        if newest is not None:
            self._serve_restored(newest)
            self.monitor.restore(self.learner.serving.version)
        else:
            self.reads.replayed_at_start = self.learner.applied
            self.learner.replay_all()
        self.monitor.leading = False
        self.leadership.claim()
        self._serve_inline_publication()

    def _serve_restored(self, loaded: LoadedVersion) -> None:
        """Serve ``loaded`` after a restart: from its newest usable snapshot and the log
        after it (``service.stream.snapshot``), or else replayed by the swapper."""
        head = self.learner.applied
        restored = None
        if self.snapshots is not None:
            restored = restore_from_snapshot(
                self.learner, self.swapper.builder, self.snapshots.snapshots, loaded
            )
        if restored is None:
            self.swapper.swap(loaded)
            replay = self.settings.fold_in_replay_events
            self.reads.replayed_at_start = head - max(0, min(loaded.last_event_id - replay, head))
            return
        self.reads.replayed_at_start = head - restored.position
        self.metrics.model_swaps.inc()
        for listener in self.swapper.after_swap:
            listener(loaded)

    def start(self) -> None:
        """Start notifications, the leader election, the log tail, the registry
        follower (``REGISTRY_POLL_SECONDS``) and event retention (``EVENT_RETENTION``)."""
        self.notifier.start()
        self.leadership.start()
        self.tail.start()
        self.follower.start(self.settings.registry_poll_seconds)
        if self.archiver is not None:
            self.archiver.start(self.settings.retention_interval_s)

    def shut_down(self, grace_s: float = RETRAIN_SHUTDOWN_GRACE_S) -> None:
        """Stop once nothing feeds it any more: a running job gets ``grace_s`` to
        publish, the heartbeats not yet saved and the rollout guard's running figures
        are written, the workers' processes stop and notifications stop.

        The heartbeats are written before the runtimes close: closing waits for the
        invocations in flight, which a job past its grace still has, and a supervisor
        kills the process when its stop timeout runs out.
        """
        self.follower.stop()
        self.tail.stop()
        if self.archiver is not None:
            self.archiver.stop()
        self.retrainer.wait(timeout=max(0.0, grace_s))
        if self.monitor.leading:
            self.monitor.flush()
            if self.guard is not None:
                self.guard.save()
        self.leadership.stop(release=True)
        self.retrainer.close()
        self.notifier.stop()


def build_driftline(
    settings: Settings,
    *,
    background_retrain: bool = True,
    metrics: Metrics | None = None,
    role: Role = "all",
) -> Driftline:
    """Every component from ``settings`` for a process of ``role``, restored from what
    is stored."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    tune_collector(settings.gc_young_threshold)
    db = Database(settings.resolved_database_url)
    registry = ModelRegistry(db, open_object_store(settings.resolved_object_store_url))
    driftline = assemble(settings, db, registry, metrics or Metrics(), background_retrain, role)
    driftline.kernels_ready = start_warm_up(settings.factors)
    driftline.restore()
    return driftline


def assemble(
    settings: Settings,
    db: Database,
    registry: ModelRegistry,
    metrics: Metrics,
    background_retrain: bool,
    role: Role = "all",
) -> Driftline:
    """The components wired together, before anything is read from the store."""
    notifier = make_notifier(settings, metrics)
    feed = EventBuffer()
    replica_id = replica_name(settings, role)
    leadership = Leadership(
        db,
        replica_id,
        settings.leader_lease_s,
        candidate=role != "serving",
        companion=stream_companion(replica_id) if role == "serving" else None,
    )
    retrainer = build_retrainer(
        settings,
        db,
        registry,
        metrics,
        background=background_retrain,
        notifier=notifier,
        events=feed,
        fencing_token=leadership.fencing_token,
    )
    event_log = EventLog(registry.store)
    builder = ServingBuilder(db, _fold_in_options(settings), _index_options(settings), event_log)
    history = RatedItems(settings.serving_history_pairs)
    ranking = PrequentialRanking(
        RankingSampler(settings.ranking_sample, settings.ranking_min_rating),
        history,
        shadow_share=settings.shadow_ranking_share,
    )
    learner = Learner(
        db,
        metrics,
        builder.empty(),
        ranking,
        history,
        popular_window=settings.popular_window,
        history_pairs=settings.serving_history_pairs,
        rating_range=(settings.rating_min, settings.rating_max),
        evaluate=role != "serving",
    )
    monitor = StreamMonitor(
        db,
        metrics,
        _detector(settings),
        HeartbeatAggregator(settings.heartbeat_events, settings.heartbeat_seconds),
        ranking,
        notifier,
        feed,
        detector_name=settings.drift_detector,
        state_key=0,
    )
    swapper = VersionSwapper(
        db,
        registry,
        builder,
        learner,
        monitor,
        retrainer,
        metrics,
        feed,
        retention_versions=settings.retention_versions,
    )
    registry.guarded = settings.guard_enabled
    guard = RolloutGuard(
        swapper, notifier, GuardOptions.of(settings), leading=lambda: leadership.is_leader
    )
    trigger = RetrainTrigger(
        db,
        registry,
        _policy(settings),
        retrainer,
        learner,
        enabled=settings.retrain_enabled,
        drift_preempts_jobs=settings.drift_preempts_jobs,
        # A version in shadow is on its way too: a scheduled job waits for its decision.
        swap_in_progress=lambda: swapper.is_swapping() or guard.shadowing,
        leading=lambda: leadership.is_leader,
    )
    swapper.after_swap.append(trigger.observe_job)
    snapshots = SnapshotWriter(
        SnapshotStore(db, registry.store),
        learner,
        lambda: leadership.is_leader,
        every=settings.snapshot_every_events,
        retention=settings.snapshot_retention,
    )
    follower = RegistryFollower(
        retrainer.published,
        on_tick=[
            trigger.start_deferred_drift,
            trigger.ask_again,
            RetrainRequests(db, trigger).answer_pending,
            snapshots.tick,
            guard.tick,
            # What the stream process stores reaches this process's dashboard feed.
            *([StoredFeedRelay(db, feed).tick] if role == "serving" else []),
        ],
        looks=[swapper.follow_registry, guard.follow],
    )
    tail = LogTail(
        lambda: _log_head(db), lambda: learner.applied, lambda: None, settings.log_poll_s
    )
    reads = StreamReads(
        db,
        registry,
        learner,
        monitor,
        trigger,
        retrainer,
        leadership,
        tail,
        min_relative_rise=settings.min_relative_drop,
        budget_usd=settings.retrain_budget_usd,
        guard=guard,
    )
    driftline = Driftline(
        settings=settings,
        db=db,
        registry=registry,
        metrics=metrics,
        notifier=notifier,
        feed=feed,
        retrainer=retrainer,
        writer=EventWriter(db, metrics),
        learner=learner,
        monitor=monitor,
        trigger=trigger,
        swapper=swapper,
        follower=follower,
        recommender=Recommender(learner, settings.serving_ann_min_items),
        reads=reads,
        leadership=leadership,
        tail=tail,
        background_retrain=background_retrain,
        snapshots=snapshots,
        event_log=event_log,
        archiver=_archiver(settings, db, registry, leadership),
        guard=guard,
    )
    driftline.tail.catch_up = driftline.catch_up
    driftline.coalescing = CoalescingIngest(
        driftline.ingest_all,
        settings.ingest_coalesce_events,
        observe=metrics.ingest_group_batches.observe,
    )
    leadership.on_elected.append(driftline._take_lead)
    leadership.on_deposed.append(driftline._stand_by)
    return driftline


def replica_name(settings: Settings, role: Role) -> str:
    """The process's name in the cluster: ``REPLICA_ID`` (default host and port); a
    stream process is named after its serving process."""
    name = settings.replica_id or default_replica_id(settings.port)
    return stream_companion(name) if role == "stream" else name


def stream_companion(replica_id: str) -> str:
    """The name of the stream process beside serving process ``replica_id``."""
    return f"{replica_id}-stream"


def _log_head(db: Database) -> int:
    with db.connect() as conn:
        return max_event_id(conn)


def _archiver(
    settings: Settings, db: Database, registry: ModelRegistry, leadership: Leadership
) -> Archiver | None:
    """The archiver ``EVENT_RETENTION`` asks for (None: keep every event), archiving
    while this process leads, under its fencing token."""
    policy = settings.retention_policy
    if policy is None:
        return None
    options = RetentionOptions(
        policy,
        dedup_horizon_s=settings.retention_dedup_horizon_s,
        keep_newest=max(settings.serving_history_pairs or 0, settings.popular_window),
        batch_rows=settings.retention_batch_rows,
        sample_size=settings.history_sample,
        sample_seed=settings.seed or 0,
    )
    return Archiver(
        db,
        registry.store,
        options,
        leading=lambda: leadership.is_leader,
        fencing_token=leadership.fencing_token,
    )


def _detector(settings: Settings) -> DriftDetector:
    return make_detector(
        settings.drift_detector,
        delta=settings.adwin_delta,
        min_relative_drop=settings.min_relative_drop,
        min_heartbeats=settings.min_heartbeats,
        rating_range=(settings.rating_min, settings.rating_max),
    )


def _policy(settings: Settings) -> TriggerPolicy:
    return make_policy(
        settings.retrain_policy,
        bootstrap_events=settings.bootstrap_events,
        refresh_events=settings.refresh_events,
        interval_s=settings.retrain_interval_s,
        weight=settings.continuum_weight,
        every_events=settings.periodic_events,
    )


def _fold_in_options(settings: Settings) -> FoldInOptions:
    return FoldInOptions(
        regularization=settings.fold_in_regularization,
        bias_regularization=settings.fold_in_bias_regularization,
        item_bias_regularization=settings.fold_in_item_bias_regularization,
        ranking_item_bias_regularization=settings.ranking_item_bias_regularization,
        scale_regularization=settings.fold_in_scale_regularization,
        forgetting=settings.fold_in_forgetting,
        rating_range=(settings.rating_min, settings.rating_max),
        max_users=settings.serving_max_users,
        max_items=settings.serving_max_items,
        cached_answers=settings.serving_cached_answers,
        answer_max_age_s=settings.serving_answer_max_age_s,
        replay_events=settings.fold_in_replay_events,
    )


def _index_options(settings: Settings) -> IndexOptions:
    return IndexOptions(
        settings.serving_index,
        settings.serving_ann_min_items,
        settings.serving_ann_probes,
        settings.serving_ann_kept_variance,
        seed=settings.seed or 0,
        codes=settings.serving_ann_codes,
    )
