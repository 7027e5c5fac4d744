"""The model registry: versions as checksummed artifacts in the object store.

Publishing writes the artifact first and registers it second, so a registered version
always has its bytes; a crash in between leaves an orphan object, never a dangling row.
Loading verifies the SHA-256 recorded at publish time, so a corrupt or tampered artifact
is refused instead of served.

A job publishes at most one version: publishing for a job that already has one returns
that one, so a job resumed after a crash between publishing and recording its success
does not register the same model twice. Retention (``prune``) deletes the artifacts of
old versions; their rows stay, marked ``deleted_at``, so the history still shows them.

With the rollout guard (``guarded``), a version published while another serves is
registered in shadow, in the same transaction: it is not the target, so no replica
serves it, until the leader's guard promotes it (``service.rollout.guard``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError

from functions.artifacts import ArtifactError, model_from_bytes, model_to_bytes, sha256_hex
from functions.mf import BiasedMF
from functions.objectstore import ObjectNotFound, ObjectStore, model_key
from service.serving.timeline import ServingChange, ServingInterval, intervals, target
from service.store import Database
from service.store.rollbacks import add_rollback, list_rollbacks
from service.store.rollouts import (
    NOT_PROMOTED,
    add_rollout,
    get_rollout,
    list_rollouts,
    update_rollout,
)
from service.store.versions import (
    add_version,
    get_version,
    list_versions,
    mark_deleted,
    version_of_job,
)

log = logging.getLogger(__name__)


class RollbackRefused(Exception):
    """A rollback that cannot be done; ``status`` is the HTTP answer that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LoadedVersion:
    """A verified model and the registry row it came from."""

    version: str
    model: BiasedMF
    last_event_id: int
    row: dict[str, Any]


class ModelRegistry:
    """Publishes and loads model versions."""

    def __init__(self, db: Database, store: ObjectStore, *, guarded: bool = False) -> None:
        self.db = db
        self.store = store
        #: Whether a version published while another serves goes into shadow first.
        self.guarded = guarded

    def publish(
        self, model: BiasedMF, *, last_event_id: int, job_id: int | None, rmse: float | None
    ) -> LoadedVersion:
        """Store ``model`` as the next version and register it; returns what was published.

        If job ``job_id`` already published a version, that version is returned instead
        (loaded from the store: a job resumed after a crash may have trained a slightly
        different model, but serving already knows the first one). The row's ``job_id``
        is unique, so even two processes publishing for the same job register one version.
        """
        if job_id is not None:
            existing = self._version_of_job(job_id)
            if existing is not None:
                return existing
        data = model_to_bytes(model)
        checksum = sha256_hex(data)
        for _attempt in range(5):
            version = self._next_version_name()
            key = model_key(version, checksum)
            self.store.put(key, data)
            row = dict(
                version=version,
                artifact_key=key,
                checksum=checksum,
                rmse=rmse,
                job_id=job_id,
                last_event_id=last_event_id,
                n_users=model.n_users,
                n_items=model.n_items,
            )
            try:
                with self.db.begin() as conn:
                    serving = self._target(conn) if self.guarded else None
                    add_version(conn, **row)
                    if serving is not None:
                        add_rollout(conn, version, compared_with=serving.version)
            except IntegrityError:
                # Another publisher took the name, or published for this job first: our
                # artifact goes, unless the winner registered the very same bytes.
                self._delete_orphan(version, key)
                if job_id is not None:
                    existing = self._version_of_job(job_id)
                    if existing is not None:
                        return existing
                continue
            log.info("published model %s (sha256 %s…)", version, checksum[:12])
            return LoadedVersion(version, model, last_event_id, row)
        raise RuntimeError("could not find a free model version name after 5 attempts")

    def _version_of_job(self, job_id: int) -> LoadedVersion | None:
        with self.db.connect() as conn:
            row = version_of_job(conn, job_id)
        if row is None:
            return None
        log.info("job %s already published %s", job_id, row["version"])
        return self.load(row["version"])

    def _delete_orphan(self, version: str, key: str) -> None:
        with self.db.connect() as conn:
            winner = get_version(conn, version)
        if winner is not None and winner["artifact_key"] == key:
            return
        try:
            self.store.delete(key)
        except (ObjectNotFound, OSError) as exc:
            log.warning("could not delete the unregistered artifact %s: %s", key, exc)

    def load(self, version: str) -> LoadedVersion:
        """The verified model of ``version``; raises ``ArtifactError`` if it is unusable."""
        with self.db.connect() as conn:
            row = get_version(conn, version)
        if row is None:
            raise KeyError(f"no model version {version!r}")
        if row.get("deleted_at") is not None:
            raise ArtifactError(f"model {version} was deleted by retention")
        try:
            data = self.store.get(row["artifact_key"])
        except ObjectNotFound as exc:
            raise ArtifactError(f"artifact of model {version} is missing: {exc}") from exc
        model = model_from_bytes(data, expected_sha256=row["checksum"])
        return LoadedVersion(version, model, int(row["last_event_id"]), row)

    def versions(self, *, include_deleted: bool = True) -> list[dict[str, Any]]:
        """Registry rows, newest first (without those retention deleted, if asked)."""
        with self.db.connect() as conn:
            rows = list_versions(conn)
        if include_deleted:
            return rows
        return [row for row in rows if row.get("deleted_at") is None]

    def newest_loadable(self) -> LoadedVersion | None:
        """The newest version whose artifact verifies and that may serve (not in shadow
        nor held); corrupt ones are skipped loudly."""
        with self.db.connect() as conn:
            waiting = {
                row["version"] for row in list_rollouts(conn) if row["state"] in NOT_PROMOTED
            }
        rows = [r for r in self.versions(include_deleted=False) if r["version"] not in waiting]
        return self._first_loadable(rows)

    def oldest_loadable(self) -> LoadedVersion | None:
        return self._first_loadable(list(reversed(self.versions(include_deleted=False))))

    def prune(self, keep: int, protected: set[str]) -> list[str]:
        """Delete the artifacts of versions beyond the newest ``keep``; returns them.

        ``protected`` versions are never deleted (the serving one, the never-retrained
        baseline, any a running job builds on). A failed delete is retried at the next
        prune: the row is marked only once its artifact is gone.
        """
        live = self.versions(include_deleted=False)
        deleted = []
        for row in live[keep:]:
            if row["version"] in protected:
                continue
            try:
                self.store.delete(row["artifact_key"])
            except ObjectNotFound:
                pass  # already gone: mark it
            except OSError as exc:
                log.warning("could not delete model %s: %s", row["version"], exc)
                continue
            with self.db.begin() as conn:
                mark_deleted(conn, row["version"])
            deleted.append(row["version"])
        if deleted:
            log.info("retention deleted %d model version(s): %s", len(deleted), deleted)
        return deleted

    def target(self) -> ServingChange | None:
        """The version that should serve now: the newest published (or promoted, when
        guarded), unless a rollback came after it (``service.serving.timeline``)."""
        with self.db.connect() as conn:
            return self._target(conn)

    @staticmethod
    def _target(conn: Connection) -> ServingChange | None:
        return target(list_versions(conn), list_rollbacks(conn), list_rollouts(conn))

    def target_loadable(self) -> LoadedVersion | None:
        """The target's verified model, else (corrupt or gone) the newest loadable one."""
        change = self.target()
        if change is not None:
            try:
                return self.load(change.version)
            except (ArtifactError, KeyError) as exc:
                log.error("refusing model %s: %s", change.version, exc)
        return self.newest_loadable()

    def serving_intervals(self) -> list[ServingInterval]:
        """When each version served, oldest first."""
        with self.db.connect() as conn:
            return intervals(list_versions(conn), list_rollbacks(conn), list_rollouts(conn))

    # -- the rollout guard's record ------------------------------------------------------
    def rollouts(self) -> list[dict[str, Any]]:
        """The guard's row of every version published while another served."""
        with self.db.connect() as conn:
            return list_rollouts(conn)

    def rollout(self, version: str) -> dict[str, Any] | None:
        with self.db.connect() as conn:
            return get_rollout(conn, version)

    def record_rollout(self, version: str, *, synced: bool = True, **values: Any) -> None:
        """Change ``version``'s rollout row (its state, times, figures); ``synced=False``
        commits without waiting for the disk (figures a decision rewrites anyway)."""
        begin = self.db.begin if synced else self.db.begin_unsynced
        with begin() as conn:
            update_rollout(conn, version, **values)

    def rollbacks(self) -> list[dict[str, Any]]:
        """Every recorded rollback, oldest first."""
        with self.db.connect() as conn:
            return list_rollbacks(conn)

    def rollback_target(self, version: str, serving: str | None) -> LoadedVersion:
        """The verified model of ``version`` to roll back to; ``RollbackRefused`` says
        why not (404: no such version, 409: it serves already or cannot be served)."""
        if version == serving:
            raise RollbackRefused(409, f"model {version} is already serving; nothing to roll back")
        try:
            return self.load(version)
        except KeyError:
            raise RollbackRefused(404, f"no model version {version!r}") from None
        except ArtifactError as exc:
            raise RollbackRefused(409, f"model {version} cannot serve again: {exc}") from exc

    def record_rollback(
        self, version: str, *, actor: str, from_version: str | None
    ) -> dict[str, Any]:
        """Store who rolled back from which version to ``version``; from now on the
        timeline's target is ``version`` until the next publish or rollback."""
        with self.db.begin() as conn:
            row = add_rollback(
                conn, actor=actor[:128], from_version=from_version, to_version=version
            )
        log.info("%s rolled back from %s to %s", actor, from_version, version)
        return row

    def _first_loadable(self, rows: list[dict[str, Any]]) -> LoadedVersion | None:
        for row in rows:
            try:
                return self.load(row["version"])
            except ArtifactError as exc:
                log.error("refusing model %s: %s", row["version"], exc)
        return None

    def _next_version_name(self) -> str:
        with self.db.connect() as conn:
            taken = {row["version"] for row in list_versions(conn)}
        number = len(taken) + 1
        while f"v{number:04d}" in taken:
            number += 1
        return f"v{number:04d}"
