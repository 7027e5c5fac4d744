"""The rollout guard: a published version serves only once it has shown, on the live
stream, that it is not worse than the version serving; after that the version it
replaced stays in shadow for a while, and comes back on its own if it does clearly
better (docs/decisions/0010-guarded-rollout.md).

States of a version published while another serves (``service.store.rollouts``)::

    shadow ──► held                      (the rule found it worse, or a newer one came)
       └─────► watch ──► kept            (promoted; the one it replaced stays in shadow)
                  └────► rolled_back     (the replaced one did clearly better)

The registry publishes such a version in shadow (``ModelRegistry.guarded``), so it is
not the target and no replica serves it. The cluster's leader runs the guard: it builds
the version's serving state as a swap would and hands it to the learner as a shadow
(``service.stream.shadow``); each batch the learner predicts, ranks and learns with it
beside the serving state, and the guard adds the paired differences to its comparison
(``service.rollout.paired``) and asks the rule (``service.rollout.rule``). A promotion
is recorded in the registry, which makes the version the target for every replica, and
on the leader installs the shadow's state as it is, caught up, without a rebuild; the
replaced state runs on as the watch's shadow. A rollback goes through the registry too,
as actor ``guard``, with an alert of kind ``rollback``. Held and rolled-back versions
are announced on the webhook (``version_held``, ``version_rolled_back``) and counted in
Prometheus.

Everything a guard knows beyond the running comparison is in the registry, so a leader
that takes over (or restarts) starts the shadow or the watch the rows ask for afresh.

Ownership: ``observe`` runs on the ingest path under the learner's lock and only
decides; ``act`` carries decisions out after the lock (promotions, holds and rollbacks
take the swapper's ``registry_lock`` first and the learner's lock inside it, as swaps
do); ``follow`` runs on the registry follower's thread and ``tick`` on its ticks, which
also save the running comparison's figures, off the ingest path.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from functions.artifacts import ArtifactError
from service.alerting import Notifier, version_held_notice, version_rolled_back_notice
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.rollout.paired import PairedComparison
from service.rollout.rule import GuardOptions, Verdict, judge_shadow, judge_watch
from service.rollout.swapper import VersionSwapper
from service.serving.registry import LoadedVersion
from service.store.alerts import add_alert
from service.store.jobs import get_job
from service.store.rollouts import HELD, KEPT, ROLLED_BACK, SHADOW, WATCH
from service.stream.learner import Evaluation
from service.stream.shadow import Role, ShadowBatch, ShadowTrack

log = logging.getLogger(__name__)

#: The actor the guard's rollbacks are recorded as.
ACTOR = "guard"
#: A running comparison's figures are saved to the registry (for the other replicas'
#: ``/models``) every this many events, at the registry follower's next tick.
SAVE_EVERY_EVENTS = 1_000


@dataclass
class _Run:
    """One running comparison: ``loaded`` in shadow beside ``baseline``."""

    loaded: LoadedVersion
    role: Role
    baseline: str | None
    drift: bool
    started_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.monotonic)
    pair: PairedComparison = field(default_factory=PairedComparison)
    next_save: int = SAVE_EVERY_EVENTS
    verdict: Verdict | None = None
    #: Observe-only: the rollback a watch would have made.
    would_roll_back: str | None = None
    #: The log position the shadow started at (every event compared comes after it).
    position: int = 0
    #: Whether figures newer than the saved ones wait for the follower's tick.
    save_due: bool = False

    @property
    def version(self) -> str:
        return self.loaded.version

    @property
    def rollout_of(self) -> str:
        """The version whose rollout this is: the candidate, or the promoted one watched."""
        return self.version if self.role == "candidate" else self.baseline or ""

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def figures(self, confidence: float) -> dict[str, Any]:
        """The comparison so far, with its decision once there is one, JSON-ready."""
        figures = self.pair.figures(confidence)
        figures.update(
            role=self.role,
            # The other side of the comparison, seen from the row it is saved in.
            compared_with=self.baseline if self.role == "candidate" else self.version,
            drift=self.drift,
            after_position=self.position,
            started_at=self.started_at,
            decision=None if self.verdict is None else self.verdict.decision,
            reason=None if self.verdict is None else self.verdict.reason,
        )
        if self.would_roll_back is not None:
            figures["would_roll_back"] = self.would_roll_back
        return figures


class RolloutGuard:
    """Runs published versions in shadow and decides their promotion and rollback."""

    def __init__(
        self,
        swapper: VersionSwapper,
        notifier: Notifier,
        options: GuardOptions,
        *,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.swapper = swapper
        self.registry = swapper.registry
        self.builder = swapper.builder
        self.learner = swapper.learner
        self.metrics: Metrics = swapper.metrics
        self.feed: EventBuffer = swapper.feed
        self.notifier = notifier
        self.options = options
        #: Whether this replica leads the cluster (only the leader's guard decides).
        self.leading = leading
        self._run: _Run | None = None
        swapper.protected_by.append(self.protected_versions)

    # -- what runs ------------------------------------------------------------------------
    @property
    def shadowing(self) -> bool:
        """Whether a published version is in shadow here (not a watch)."""
        run = self._run
        return run is not None and run.role == "candidate"

    def status(self) -> dict[str, Any] | None:
        """The running comparison: whose rollout it is (``rollout_of``), the version in
        shadow and the figures so far; None: none runs here."""
        run = self._run
        if run is None:
            return None
        figures = run.figures(self.options.confidence)
        return {"rollout_of": run.rollout_of, "version": run.version, **figures}

    def protected_versions(self) -> set[str]:
        run = self._run
        return set() if run is None else {run.version}

    # -- the registry follower's look -----------------------------------------------------------
    def follow(self) -> None:
        """Run the shadow the registry asks for: the newest version in shadow, else the
        version a promoted one replaced while it is watched; hold older ones."""
        learner = self.learner
        if not (self.options.enabled and learner.evaluate and self.leading()):
            return
        with self.swapper.registry_lock:
            serving = learner.current
            if serving is None:
                return
            wanted, stale = self._wanted(serving.version)
            run = self._run
            for version in stale:  # the running one is held with its figures below
                if run is None or version != run.version:
                    self._hold_row(version, f"superseded by {wanted and wanted[0]}")
            if run is not None and wanted == (run.version, run.role):
                return
            self._end_running(wanted)
            if wanted is not None:
                self._start(*wanted, serving.version)

    def _wanted(self, serving: str) -> tuple[tuple[str, Role] | None, list[str]]:
        """Which version should be in shadow and why, and the older versions in shadow
        that a newer one supersedes."""
        rows = self.registry.rollouts()
        candidates = [row for row in rows if row["state"] == SHADOW]
        for row in candidates:
            if row["version"] == serving:  # someone rolled back to it: it serves
                self.registry.record_rollout(
                    serving, state=KEPT, decided_at=time.time(), shadow=self._note(row, "served")
                )
        candidates = [row for row in candidates if row["version"] != serving]
        if candidates:
            stale = [row["version"] for row in candidates[:-1]]
            return (candidates[-1]["version"], "candidate"), stale
        mine = next((row for row in rows if row["version"] == serving), None)
        if mine is not None and mine["state"] == WATCH and mine.get("compared_with"):
            if self.options.watch_events > 0:
                return (mine["compared_with"], "previous"), []
            self.registry.record_rollout(serving, state=KEPT, watch_ended_at=time.time())
        return None, []

    def _note(self, row: dict[str, Any], decision: str) -> dict[str, Any]:
        reason = "served by a rollback to it" if decision == "served" else decision
        return {**(row.get("shadow") or {}), "decision": decision, "reason": reason}

    def _end_running(self, wanted: tuple[str, Role] | None) -> None:
        """Stop the running comparison, which ``wanted`` replaces (under the registry lock)."""
        run = self._run
        if run is None:
            return
        with self.learner.lock:
            self.learner.stop_shadow()
            self._run = None
        self.metrics.shadow_events.set(0)
        if run.role == "candidate":
            # None: its row was settled meanwhile (someone rolled back to it).
            if wanted is not None and wanted[0] != run.version:
                self._hold_row(run.version, f"superseded by {wanted[0]}", run)
            return
        note = "watch ended" if wanted is None else f"watch ended: {wanted[0]} in shadow"
        run.verdict = Verdict("keep", note)
        self._record(run.baseline or "", state=KEPT, watch_ended_at=time.time(), watch=run)

    def _start(self, version: str, role: Role, serving: str) -> None:
        """Build ``version``'s serving state and run it in shadow (under the registry lock)."""
        try:
            loaded = self.registry.load(version)
        except (ArtifactError, KeyError) as exc:
            log.error("cannot run model %s in shadow: %s", version, exc)
            if role == "candidate":
                self._hold_row(version, f"its artifact cannot be loaded: {exc}")
            else:
                self.registry.record_rollout(serving, state=KEPT, watch_ended_at=time.time())
            return
        learner = self.learner
        next_state = self.builder.build(loaded, lambda: learner.applied)
        run = _Run(loaded, role, serving, role == "candidate" and self._from_drift(loaded))
        with learner.lock:
            self.builder.catch_up(next_state, learner.applied)
            learner.start_shadow(ShadowTrack(next_state.serving, loaded, role))
            run.position = learner.applied
            self._run = run
        log.info("model %s in shadow (%s) beside %s", version, role, serving)
        self.feed.publish("rollout", {"version": version, "role": role, "state": "shadow"})
        if role == "candidate":
            self._record(version, shadow_started_at=run.started_at, compared_with=serving)
            if self.options.observe_only:
                run.verdict = Verdict("promote", "observe only: promoted at once")
                self._promote(run)

    def _from_drift(self, loaded: LoadedVersion) -> bool:
        """Whether ``loaded`` came from a drift job (compared after its change point)."""
        job_id = loaded.row.get("job_id")
        if job_id is None:
            return False
        try:
            with self.registry.db.connect() as conn:
                job = get_job(conn, int(job_id))
        except SQLAlchemyError:
            log.exception("reading job %s for the rollout guard", job_id)
            return False
        return job is not None and job.get("trigger") == "drift"

    # -- the ingest path (under the learner's lock) ----------------------------------------
    def observe(self, evaluation: Evaluation) -> None:
        """Add a batch's paired figures to the running comparison and ask the rule."""
        run, batch = self._run, evaluation.shadow
        if run is None or batch is None or run.verdict is not None:
            return
        if batch.version != run.version:
            return
        if batch.serving_version != run.baseline and not self._rebase(run, batch):
            return
        self._add(run, batch)
        pair, options = run.pair, self.options
        if run.role == "candidate":
            verdict = judge_shadow(pair, options, drift=run.drift, elapsed_s=run.elapsed_s)
        else:
            verdict = judge_watch(pair, options)
            if verdict is not None and verdict.decision == "roll_back" and options.observe_only:
                run.would_roll_back = run.would_roll_back or verdict.reason
                verdict = None
                if pair.events >= options.watch_events:
                    verdict = Verdict("keep", f"observe only, kept after {pair.events:,} events")
        if verdict is not None:
            run.verdict = verdict
        elif pair.events >= run.next_save:
            run.next_save += SAVE_EVERY_EVENTS
            run.save_due = True

    def _rebase(self, run: _Run, batch: ShadowBatch) -> bool:
        """The serving version changed under the shadow (a rollback by hand): a
        candidate is compared afresh with the new one (or, served itself, stops being
        compared); a watch ends. Whether to go on comparing."""
        if run.role == "candidate" and batch.serving_version != run.version:
            log.info("model %s in shadow: %s serves now", run.version, batch.serving_version)
            run.baseline, run.pair = batch.serving_version, PairedComparison()
            run.next_save = SAVE_EVERY_EVENTS
            return True
        reason = f"{batch.serving_version} serves instead"
        run.verdict = Verdict("keep" if run.role == "previous" else "served", reason)
        return False

    @staticmethod
    def _add(run: _Run, batch: ShadowBatch) -> None:
        """New minus old: the shadow is new for a candidate, old for a watch."""
        old, new = (batch.serving_errors, batch.shadow_errors)
        old_ranks, new_ranks = (batch.serving_ranks, batch.shadow_ranks)
        if run.role == "previous":
            old, new, old_ranks, new_ranks = new, old, new_ranks, old_ranks
        codes = run.pair.codes_of(batch.users)  # each of the batch's users looked up once
        run.pair.add_errors(codes[batch.user_codes], old, new)
        run.pair.add_ranks(codes[batch.ranked_codes], old_ranks, new_ranks)

    # -- after the lock ---------------------------------------------------------------------
    def act(self, *, wait: bool = False) -> None:
        """Carry out the running comparison's decision, if it has one. The ingest path
        does not ``wait`` for the registry lock: while a swap holds it, the registry
        follower's next tick carries the decision out."""
        run = self._run
        if run is None or run.verdict is None:
            return
        lock = self.swapper.registry_lock
        if not lock.acquire(blocking=wait):
            return
        try:
            if self._run is run:
                self._carry_out(run)
        except SQLAlchemyError:
            log.exception("could not record the rollout guard's decision; trying again")
        finally:
            lock.release()

    def tick(self) -> None:
        """Save the running comparison's newest figures; decide a shadow past
        ``SHADOW_MAX_S`` even when no events arrive; carry out a decision the ingest
        path left."""
        self._save_figures()
        run = self._run
        timed_out = (
            run is not None
            and run.verdict is None
            and run.role == "candidate"
            and run.elapsed_s >= self.options.max_s
        )
        if run is not None and timed_out:
            with self.learner.lock:
                if self._run is run and run.verdict is None:
                    run.verdict = judge_shadow(
                        run.pair, self.options, drift=run.drift, elapsed_s=run.elapsed_s
                    )
        self.act(wait=True)

    def _save_figures(self, *, synced: bool = False) -> None:
        """Save the running comparison's figures when a save is due (off the ingest
        path: the figures are taken under the learner's lock, written after it)."""
        run = self._run
        if run is None or not run.save_due:
            return
        with self.learner.lock:
            run.save_due = False
            figures = run.figures(self.options.confidence)
        self.metrics.shadow_events.set(figures["events_compared"])
        column = "shadow" if run.role == "candidate" else "watch"
        try:
            self.registry.record_rollout(run.rollout_of, synced=synced, **{column: figures})
        except SQLAlchemyError:
            log.exception("could not save the rollout guard's figures; the next save will")

    def save(self) -> None:
        """Save the running comparison's figures now and wait for the disk: a clean stop
        keeps what ``/models`` showed (a restart runs the comparison afresh)."""
        run = self._run
        if run is None or run.verdict is not None:
            return
        run.save_due = True
        self._save_figures(synced=True)

    def stand_by(self) -> None:
        """Another replica leads: stop the comparison (the leader starts its own)."""
        with self.learner.lock:
            self.learner.stop_shadow()
            self._run = None
        self.metrics.shadow_events.set(0)

    def _carry_out(self, run: _Run) -> None:
        """Promote, finish or roll back as ``run``'s verdict says (under the registry lock)."""
        verdict = run.verdict
        assert verdict is not None
        if verdict.decision == "promote":
            self._promote(run)
        elif verdict.decision == "roll_back":
            self._roll_back(run)
        else:
            self._finish(run)

    def _promote(self, run: _Run) -> None:
        """Serve the candidate's state as it is; the state it replaces runs on as the
        watch's shadow (under the registry lock)."""
        learner, options = self.learner, self.options
        watch = options.watch_events > 0
        now = time.time()
        self._record(
            run.version,
            state=WATCH if watch else KEPT,
            promoted_at=now,
            decided_at=now,
            compared_with=run.baseline,
            shadow=run,
        )

        def install() -> None:
            replaced = learner.promote_shadow(keep_replaced=watch)
            self._run = None
            if watch and replaced is not None:
                watched = _Run(replaced, "previous", run.version, drift=False)
                watched.position = learner.applied
                self._run = watched

        self.swapper.install_prepared(run.loaded, None, install)
        self.metrics.version_promoted.inc()
        self.metrics.shadow_events.set(0)
        self.feed.publish("rollout", {"version": run.version, "state": "promoted"})
        log.info("promoted model %s: %s", run.version, run.verdict and run.verdict.reason)
        self.swapper.apply_retention()

    def _finish(self, run: _Run) -> None:
        """End a comparison without a swap: a candidate held (or served by hand), or a
        watch that kept its version (under the registry lock)."""
        verdict = run.verdict
        assert verdict is not None
        with self.learner.lock:
            self.learner.stop_shadow()
            self._run = None
        self.metrics.shadow_events.set(0)
        now = time.time()
        if run.role == "previous":
            self._record(run.baseline or "", state=KEPT, watch_ended_at=now, watch=run)
            log.info("model %s kept after its watch: %s", run.baseline, verdict.reason)
            return
        if verdict.decision == "served":
            self._record(run.version, state=KEPT, decided_at=now, shadow=run)
            return
        self._record(run.version, state=HELD, decided_at=now, shadow=run)
        self._announce_hold(run.version, run.baseline, verdict.reason)

    def _hold_row(self, version: str, reason: str, run: _Run | None = None) -> None:
        """Hold ``version`` without running it (superseded, or unusable)."""
        if run is not None:
            run.verdict = Verdict("hold", reason)
            figures: dict[str, Any] = run.figures(self.options.confidence)
        else:
            row = self.registry.rollout(version) or {}
            figures = {**(row.get("shadow") or {}), "decision": "hold", "reason": reason}
        self.registry.record_rollout(version, state=HELD, decided_at=time.time(), shadow=figures)
        self._announce_hold(version, self.learner.serving.version, reason)

    def _announce_hold(self, version: str, serving: str | None, reason: str) -> None:
        self.metrics.version_held.inc()
        self.notifier.notify(version_held_notice(version, serving, reason))
        self.feed.publish("rollout", {"version": version, "state": HELD, "reason": reason})
        log.warning("model %s held: %s", version, reason)

    def _roll_back(self, run: _Run) -> None:
        """Serve the watched, replaced version again, as actor ``guard``, with an alert
        (under the registry lock)."""
        learner, verdict = self.learner, run.verdict
        assert verdict is not None
        promoted = run.baseline or ""
        self.registry.record_rollback(run.version, actor=ACTOR, from_version=promoted)
        self._record(promoted, state=ROLLED_BACK, watch_ended_at=time.time(), watch=run)

        def install() -> None:
            learner.promote_shadow(keep_replaced=False)
            self._run = None

        self.swapper.install_prepared(run.loaded, "rollback", install)
        seen = learner.labelled_seen
        self.metrics.model_rollbacks.inc()
        self.metrics.version_rolled_back.inc()
        self.metrics.shadow_events.set(0)
        alert_id = self._store_alert(run, promoted, seen)
        self.notifier.notify(version_rolled_back_notice(promoted, run.version, verdict.reason))
        self.feed.publish("rollout", {"version": promoted, "state": ROLLED_BACK, "alert": alert_id})
        log.warning("rolled back from %s to %s: %s", promoted, run.version, verdict.reason)

    def _store_alert(self, run: _Run, promoted: str, seen: int) -> int | None:
        """The rollback's alert (kind ``rollback``): the metric that decided it, the
        replaced version's figure as ``before`` and the promoted one's as ``after``."""
        pair = run.pair
        old_mse, change = pair.old_mse, pair.squared.mean
        metric, before, after = "rmse", math.sqrt(old_mse), math.sqrt(max(0.0, old_mse + change))
        hit = pair.hit_rate_diff(self.options.confidence)
        rmse_low = pair.rmse_diff(self.options.confidence).low
        if pair.ranked_events and not rmse_low > self.options.tolerance:
            metric, before = "hit_rate", pair.old_hit_rate
            after = before + hit.estimate
        try:
            with self.registry.db.begin() as conn:
                return add_alert(
                    conn,
                    kind="rollback",
                    metric=metric,
                    before=float(before),
                    after=float(after),
                    events_seen=seen,
                    model_version=promoted,
                    detector=ACTOR,
                )
        except SQLAlchemyError:
            log.exception("could not store the alert of the rollback from %s", promoted)
            return None

    def _record(
        self, version: str, *, shadow: _Run | None = None, watch: _Run | None = None, **values: Any
    ) -> None:
        """Write ``version``'s rollout row, with a run's figures as its shadow or watch."""
        confidence = self.options.confidence
        if shadow is not None:
            values["shadow"] = shadow.figures(confidence)
        if watch is not None:
            values["watch"] = watch.figures(confidence)
        self.registry.record_rollout(version, **values)
