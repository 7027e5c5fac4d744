"""The model registry: versions as checksummed artifacts in the object store.

Publishing writes the artifact first and registers it second, so a registered version
always has its bytes; a crash in between leaves an orphan object, never a dangling row.
Loading verifies the SHA-256 recorded at publish time, so a corrupt or tampered artifact
is refused instead of served.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError

from functions.artifacts import ArtifactError, model_from_bytes, model_to_bytes, sha256_hex
from functions.mf import BiasedMF
from functions.objectstore import ObjectNotFound, ObjectStore, model_key
from service.store import Database
from service.store.versions import add_version, get_version, list_versions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedVersion:
    """A verified model and the registry row it came from."""

    version: str
    model: BiasedMF
    last_event_id: int
    row: dict[str, Any]


class ModelRegistry:
    """Publishes and loads model versions."""

    def __init__(self, db: Database, store: ObjectStore) -> None:
        self.db = db
        self.store = store

    def publish(
        self, model: BiasedMF, *, last_event_id: int, job_id: int | None, rmse: float | None
    ) -> LoadedVersion:
        """Store ``model`` as the next version and register it; returns what was published."""
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
                    add_version(conn, **row)
            except IntegrityError:
                continue  # another publisher took the name; take the next one
            log.info("published model %s (sha256 %s…)", version, checksum[:12])
            return LoadedVersion(version, model, last_event_id, row)
        raise RuntimeError("could not find a free model version name after 5 attempts")

    def load(self, version: str) -> LoadedVersion:
        """The verified model of ``version``; raises ``ArtifactError`` if it is unusable."""
        with self.db.connect() as conn:
            row = get_version(conn, version)
        if row is None:
            raise KeyError(f"no model version {version!r}")
        try:
            data = self.store.get(row["artifact_key"])
        except ObjectNotFound as exc:
            raise ArtifactError(f"artifact of model {version} is missing: {exc}") from exc
        model = model_from_bytes(data, expected_sha256=row["checksum"])
        return LoadedVersion(version, model, int(row["last_event_id"]), row)

    def versions(self) -> list[dict[str, Any]]:
        """Registry rows, newest first."""
        with self.db.connect() as conn:
            return list_versions(conn)

    def newest_loadable(self) -> LoadedVersion | None:
        """The newest version whose artifact verifies; corrupt ones are skipped loudly."""
        return self._first_loadable(self.versions())

    def oldest_loadable(self) -> LoadedVersion | None:
        return self._first_loadable(list(reversed(self.versions())))

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
