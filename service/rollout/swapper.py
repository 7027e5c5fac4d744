"""The version swapper: follow the registry, swap in the next serving state, roll back.

Versions reach serving only through the registry: a version published by this process's
retrainer or by another process sharing the database, or a rollback made anywhere, is
the registry's target, and ``follow_registry`` swaps it in. A swap builds the next
serving state outside the learner's lock (``ServingBuilder``), then folds in the last
events and installs it under the lock; the monitor learns of the swap in the same
step, the policy right after. Old versions' artifacts are pruned after each swap
(``RETENTION_VERSIONS``).

With the rollout guard (``service.rollout.guard``), a published version is not the
registry's target until the guard promotes it; the guard installs the state its shadow
kept current (``install_prepared``), a swap without a rebuild, and the swapper's
follower serves promotions and the guard's rollbacks on the other replicas as it
serves any target.

Ownership: ``registry_lock`` is held while choosing and swapping in the registry's
target, so a rollback, the guard and the follower never swap against each other. The
follower looks at the target first without it, and takes it only when the target is not
what serves: its look every ``REGISTRY_POLL_SECONDS`` would otherwise hold the lock, and
the trigger reads a held lock as a version on its way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from functions.artifacts import ArtifactError
from retrain.lifecycle import Retrainer
from service.livefeed import EventBuffer
from service.metrics import Metrics
from service.serving.builder import ServingBuilder
from service.serving.registry import LoadedVersion, ModelRegistry
from service.serving.timeline import ServingChange
from service.store import Database
from service.store.jobs import job_trigger
from service.stream.learner import Learner
from service.stream.monitor import StreamMonitor

log = logging.getLogger(__name__)

#: Triggers whose jobs start a new error regime: after a drift retrain, a first model or
#: an operator's retrain or rollback, the drift monitor learns the new version's level
#: afresh; after any other (scheduled) job it keeps its reference through the swap.
NEW_REGIME_TRIGGERS = frozenset({"drift", "bootstrap", "manual", "rollback"})


class VersionSwapper:
    """Keeps the serving state on the registry's target version."""

    def __init__(
        self,
        db: Database,
        registry: ModelRegistry,
        builder: ServingBuilder,
        learner: Learner,
        monitor: StreamMonitor,
        retrainer: Retrainer,
        metrics: Metrics,
        feed: EventBuffer,
        *,
        retention_versions: int,
    ) -> None:
        self.db = db
        self.registry = registry
        self.builder = builder
        self.learner = learner
        self.monitor = monitor
        self.retrainer = retrainer
        self.metrics = metrics
        self.feed = feed
        self.retention_versions = retention_versions
        #: Called with each version once it serves (outside the learner's lock).
        self.after_swap: list[Callable[[LoadedVersion], None]] = []
        #: More versions retention must keep (the rollout guard's shadow and watch).
        self.protected_by: list[Callable[[], Iterable[str]]] = []
        self.registry_lock = threading.Lock()
        #: Time spent building serving states for new versions.
        self.swap_seconds = 0.0

    def is_swapping(self) -> bool:
        return self.registry_lock.locked()

    def swap(self, loaded: LoadedVersion, trigger: str | None = None) -> None:
        """Serve ``loaded`` from now on, with fold-in of everything it has not seen.

        ``trigger`` says why when it is not the version's job (``rollback``): the drift
        monitor starts afresh after a swap in ``NEW_REGIME_TRIGGERS``. Requests go on
        being served by the old version until the switch.
        """
        began = time.perf_counter()
        learner = self.learner
        next_state = self.builder.build(loaded, lambda: learner.applied)

        def install() -> None:
            self.builder.catch_up(next_state, learner.applied)
            learner.install(next_state.serving, loaded)

        self.install_prepared(loaded, trigger, install)
        self.swap_seconds += time.perf_counter() - began

    def install_prepared(
        self, loaded: LoadedVersion, trigger: str | None, install: Callable[[], None]
    ) -> None:
        """Serve ``loaded`` from a state made ready already: ``install`` puts it in
        place under the learner's lock (a swap's built state, or a shadow the rollout
        guard promotes or rolls back to); the monitor, the live feed, the listeners and
        the metrics hear of it as of any swap. ``trigger`` as for ``swap``."""
        why = trigger or self._job_trigger(loaded)  # also the live feed's swap event's
        continues_regime = self._continues_regime(why, explicit=trigger is not None)
        learner = self.learner
        with learner.lock:
            install()
            self.monitor.on_swap(loaded.version, continues_regime)
            events_seen = learner.labelled_seen
        self.feed.publish(
            "swap", {"version": loaded.version, "events_seen": events_seen, "trigger": why}
        )
        for listener in self.after_swap:
            listener(loaded)
        self.metrics.model_swaps.inc()
        log.info("serving model %s", loaded.version)

    def swap_to(self, version: str, trigger: str | None = None) -> bool:
        """Load ``version`` from the registry and serve it; a bad artifact keeps the old one."""
        try:
            loaded = self.registry.load(version)
        except ArtifactError as exc:
            self.metrics.model_load_failures.inc()
            log.error(
                "refusing model %s: %s; still serving %s",
                version,
                exc,
                self.learner.serving.version,
            )
            return False
        self.swap(loaded, trigger)
        return True

    def follow_registry(self) -> bool:
        """Serve the registry's target if it is not serving yet; returns whether it swapped.

        Consumer replicas and servers that share a database also share versions: a
        version published anywhere, or a rollback made anywhere, is picked up here
        (``service.serving.timeline``).
        """
        self.retrainer.published.clear()
        if not self._wants(self.registry.target()):
            return False  # the usual look: nothing new, and the registry lock stays free
        with self.registry_lock:
            change = self.registry.target()  # again: a rollback may have come meanwhile
            if change is None or not self._wants(change):
                return False
            trigger = "rollback" if change.trigger == "rollback" else None
            swapped = self.swap_to(change.version, trigger)
        if swapped:
            self.apply_retention()
        return swapped

    def _wants(self, change: ServingChange | None) -> bool:
        """Whether ``change`` asks for a version other than the one serving: not the
        serving one, nor a publication older than it."""
        if change is None or change.version == self.learner.serving.version:
            return False
        current = self.learner.current
        return not (
            change.trigger == "publish" and current and change.at <= current.row["created_at"]
        )

    def rollback(self, version: str, actor: str) -> dict[str, Any]:
        """Serve the earlier ``version`` again, recorded as ``actor``'s rollback.

        Verified before it is recorded, swapped in before this returns; the drift
        monitor treats it as a new regime. Rolling back to the version served before
        undoes it. ``RollbackRefused`` (404, 409) when it cannot be done.
        """
        with self.registry_lock:
            serving = self.learner.serving.version
            loaded = self.registry.rollback_target(version, serving)
            record = self.registry.record_rollback(version, actor=actor, from_version=serving)
            self.swap(loaded, trigger="rollback")
        self.metrics.model_rollbacks.inc()
        return record

    def apply_retention(self) -> None:
        """Delete old versions' artifacts, keeping the serving one, the never-retrained
        baseline (the static track predicts with it for as long as the service runs) and
        those running jobs build on (here or in another process sharing the database)."""
        try:
            protected = {self.learner.serving.version, *self.retrainer.protected_versions()}
            for more in self.protected_by:
                protected.update(more())
            oldest = self.registry.versions(include_deleted=False)[-1:]
            protected.update(row["version"] for row in oldest)
            self.registry.prune(self.retention_versions, {v for v in protected if v})
        except SQLAlchemyError:
            log.exception("could not apply model retention; the next swap tries again")

    def _continues_regime(self, trigger: str | None, *, explicit: bool) -> bool:
        """Whether a version swapped in for ``trigger`` was trained on a schedule over
        the stream the serving version saw (the monitor keeps its reference), rather
        than after a drift alert, as the first model, by hand or rolled back to (the
        monitor starts afresh). A trigger read from the version's job (not ``explicit``)
        continues nothing while no version serves, nor when the store cannot say."""
        if trigger is None or (not explicit and self.learner.current is None):
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
