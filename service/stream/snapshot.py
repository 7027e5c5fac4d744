"""Snapshots of the online state, so a replica that starts replays only the log after one.

The online state is what a replica learnt from the event log on top of the serving
version: the fold-in (users' rows, items' online biases, the rating sums), the rated
items and the popular items, at a log position (``Learner.applied``). Without a
snapshot a (re)starting replica rebuilds it by replaying the log from shortly before the
version's last training event (``ServingBuilder``): when that version is old, every
event since. With one, it loads the newest snapshot of the version it is to serve and
folds in only the events stored after its position, batch by batch as they were stored,
so it reaches the very state a replica that never stopped holds.

Writing: the cluster's leader, every ``SNAPSHOT_EVERY_EVENTS`` of the log, from the
registry follower's tick. The state is copied under the learner's lock (arrays copied,
the rest read from the published immutable snapshots), then serialised and uploaded
outside it. Each snapshot is an ``.npz`` of plain arrays (ids as arrays of str, read
with ``allow_pickle=False``) with a JSON header, stored under
``snapshots/<position>-<sha256[:16]>.npz`` (two leaders in turn may write the same
position from different states: the checksum keeps their objects apart) and recorded,
with its SHA-256, in ``online_snapshots``; the newest ``SNAPSHOT_RETENTION`` are kept.

Reading: ``Driftline.restore`` asks for the newest snapshot of the registry's target
version at or before the log head. One of another version (a newer one was published
since), a missing object, a checksum mismatch or a state that does not fit the
settings (``ServingModel.settings``) is not used: the replica falls back to the replay.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import delete, insert, select

from functions.artifacts import ArtifactError, dump_arrays, load_verified, sha256_hex
from functions.objectstore import ObjectNotFound, ObjectStore, validate_key
from service.serving.builder import ServingBuilder
from service.serving.popular import PopularItems
from service.serving.registry import LoadedVersion
from service.store import Database
from service.store.events import log_after
from service.store.tables import online_snapshots
from service.stream.learner import Learner

log = logging.getLogger(__name__)

#: Object store prefix of the snapshots.
SNAPSHOTS_PREFIX = "snapshots/"
#: The layout written; a reader refuses any other.
FORMAT = 1
#: Events of the log read at a time when folding in the events after a snapshot.
TAIL_PAGE_EVENTS = 5_000


class SnapshotError(ValueError):
    """A snapshot that cannot be used: missing, damaged or not fitting this process."""


@dataclass(frozen=True)
class OnlineSnapshot:
    """The online state at log position ``position``, on top of ``version``."""

    version: str
    position: int
    labelled_seen: int
    settings: dict[str, Any]
    serving: dict[str, np.ndarray]
    serving_scalars: dict[str, Any]
    history: dict[str, np.ndarray]
    popular: dict[str, np.ndarray]


def capture(learner: Learner) -> OnlineSnapshot | None:
    """A copy of ``learner``'s online state (None before any version serves); takes the
    learner's lock only for the copy."""
    with learner.lock:
        serving = learner.serving
        if learner.current is None or serving.version is None:
            return None
        arrays, scalars = serving.export_state()
        history = learner.history.export_state()
        popular = learner.popular.export_state()
        return OnlineSnapshot(
            serving.version,
            learner.applied,
            learner.labelled_seen,
            serving.settings(),
            arrays,
            scalars,
            history,
            popular,
        )


def to_bytes(snapshot: OnlineSnapshot) -> bytes:
    """The snapshot as ``.npz`` bytes: its arrays, and its scalars in a JSON ``header``."""
    header = {
        "format": FORMAT,
        "version": snapshot.version,
        "position": snapshot.position,
        "labelled_seen": snapshot.labelled_seen,
        "settings": snapshot.settings,
        "serving": snapshot.serving_scalars,
    }
    arrays: dict[str, np.ndarray] = {"header": np.array(json.dumps(header, sort_keys=True))}
    for part, values in (
        ("serving", snapshot.serving),
        ("history", snapshot.history),
        ("popular", snapshot.popular),
    ):
        for name, value in values.items():
            arrays[f"{part}.{name}"] = value
    return dump_arrays(arrays)


def from_bytes(data: bytes, checksum: str) -> OnlineSnapshot:
    """The snapshot ``to_bytes`` wrote, after checking ``checksum``; ``SnapshotError``
    if the bytes are damaged or not a snapshot."""
    try:
        arrays = load_verified(data, checksum)
        header = json.loads(str(arrays.pop("header")))
        if header.get("format") != FORMAT:
            raise SnapshotError(f"snapshot format {header.get('format')!r}, not {FORMAT}")
        parts: dict[str, dict[str, np.ndarray]] = {"serving": {}, "history": {}, "popular": {}}
        for name, value in arrays.items():
            part, _, field = name.partition(".")
            parts[part][field] = value
        return OnlineSnapshot(
            str(header["version"]),
            int(header["position"]),
            int(header["labelled_seen"]),
            dict(header["settings"]),
            parts["serving"],
            dict(header["serving"]),
            parts["history"],
            parts["popular"],
        )
    except SnapshotError:
        raise
    except (ArtifactError, ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"not a readable snapshot: {exc}") from exc


def snapshot_key(position: int, checksum: str) -> str:
    """``snapshots/<position>-<sha256[:16]>.npz``."""
    return validate_key(f"{SNAPSHOTS_PREFIX}{position}-{checksum[:16]}.npz")


class SnapshotStore:
    """Snapshots in the object store, recorded in ``online_snapshots``."""

    def __init__(self, db: Database, store: ObjectStore) -> None:
        self.db = db
        self.store = store

    def save(self, snapshot: OnlineSnapshot) -> dict[str, Any]:
        """Upload ``snapshot``, then record it (a crash between leaves an orphan object,
        never a row without its bytes); returns the row."""
        data = to_bytes(snapshot)
        checksum = sha256_hex(data)
        key = snapshot_key(snapshot.position, checksum)
        self.store.put(key, data)
        row = {
            "position": snapshot.position,
            "version": snapshot.version,
            "key": key,
            "checksum": checksum,
            "created_at": time.time(),
            "size": len(data),
        }
        with self.db.begin() as conn:
            conn.execute(insert(online_snapshots).values(**row))
        return row

    def rows(self) -> list[dict[str, Any]]:
        """Every recorded snapshot, newest position first."""
        query = select(online_snapshots).order_by(
            online_snapshots.c.position.desc(), online_snapshots.c.id.desc()
        )
        with self.db.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def newest(self, version: str, up_to: int) -> dict[str, Any] | None:
        """The newest snapshot of ``version`` at or before log position ``up_to``."""
        query = (
            select(online_snapshots)
            .where(online_snapshots.c.version == version, online_snapshots.c.position <= up_to)
            .order_by(online_snapshots.c.position.desc(), online_snapshots.c.id.desc())
            .limit(1)
        )
        with self.db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else dict(row._mapping)

    def load(self, row: dict[str, Any]) -> OnlineSnapshot:
        """The verified snapshot of ``row``; ``SnapshotError`` if it is unusable."""
        try:
            data = self.store.get(row["key"])
        except (ObjectNotFound, OSError) as exc:
            raise SnapshotError(f"snapshot {row['key']} is missing: {exc}") from exc
        snapshot = from_bytes(data, row["checksum"])
        if snapshot.position != row["position"] or snapshot.version != row["version"]:
            raise SnapshotError(f"snapshot {row['key']} does not hold what its row says")
        return snapshot

    def prune(self, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` snapshots, objects then rows; returns the
        deleted keys."""
        deleted = []
        for row in self.rows()[keep:]:
            try:
                self.store.delete(row["key"])
            except ObjectNotFound:
                pass
            except OSError as exc:  # the next prune tries again
                log.warning("could not delete snapshot %s: %s", row["key"], exc)
                continue
            with self.db.begin() as conn:
                conn.execute(delete(online_snapshots).where(online_snapshots.c.id == row["id"]))
            deleted.append(row["key"])
        return deleted


class SnapshotWriter:
    """Writes a snapshot every ``every`` events of the log while ``leading()``; a tick
    task of the registry follower."""

    def __init__(
        self,
        snapshots: SnapshotStore,
        learner: Learner,
        leading: Callable[[], bool],
        *,
        every: int | None,
        retention: int,
    ) -> None:
        self.snapshots = snapshots
        self.learner = learner
        self.leading = leading
        self.every = every
        self.retention = retention
        #: Log position of the newest snapshot (None: not read from the store yet).
        self.last_position: int | None = None
        self._lock = threading.Lock()

    def tick(self) -> dict[str, Any] | None:
        """Write a snapshot if one is due; returns its row."""
        if self.every is None or not self.leading():
            return None
        if self.last_position is None:
            rows = self.snapshots.rows()
            self.last_position = rows[0]["position"] if rows else 0
        if self.learner.applied - self.last_position < self.every:
            return None
        return self.write()

    def write(self) -> dict[str, Any] | None:
        """Write a snapshot now, then apply retention; returns its row (None: no version
        serves yet)."""
        with self._lock:
            began = time.perf_counter()
            snapshot = capture(self.learner)
            if snapshot is None:
                return None
            row = self.snapshots.save(snapshot)
            self.last_position = snapshot.position
            self.snapshots.prune(self.retention)
        log.info(
            "wrote online snapshot %s at position %d (%d bytes, %.2f s)",
            row["key"],
            row["position"],
            row["size"],
            time.perf_counter() - began,
        )
        return row


@dataclass(frozen=True)
class Restored:
    """A restore from a snapshot: its key and position, and the events folded in after."""

    key: str
    position: int
    replayed: int


def restore_from_snapshot(
    learner: Learner,
    builder: ServingBuilder,
    snapshots: SnapshotStore,
    loaded: LoadedVersion,
) -> Restored | None:
    """Install ``loaded`` with the newest usable snapshot of it and fold in the log
    after it, up to the position the learner restored (the head); None, with the
    learner untouched, if there is none or it cannot be used.

    The events after the snapshot are folded in without evaluation, as the replay
    without a snapshot does: every stored event was evaluated when first learnt.
    """
    head = learner.applied
    row = snapshots.newest(loaded.version, head)
    if row is None:
        return None
    try:
        snapshot = snapshots.load(row)
        serving = builder._model(loaded)
        if snapshot.settings != _json_round_trip(serving.settings()):
            raise SnapshotError("written under other fold-in settings")
        serving.load_state(snapshot.serving, snapshot.serving_scalars)
        popular = PopularItems.from_state(snapshot.popular, learner.popular_window)
        learner.history.load_state(snapshot.history)  # checks everything before it changes
    except (SnapshotError, ValueError, KeyError) as exc:
        log.warning("not restoring from snapshot %s: %s; replaying the log", row["key"], exc)
        return None
    learner.popular = popular
    builder._index(serving)
    with learner.lock:
        learner.install(serving, loaded)
        learner.applied, learner.labelled_seen = snapshot.position, snapshot.labelled_seen
        log.info(
            "restored online state at position %d from snapshot %s; %d events to apply",
            snapshot.position,
            row["key"],
            head - snapshot.position,
        )
        replayed = _fold_in_log(learner, head)
        learner.seen_at_swap = learner.labelled_seen
    return Restored(row["key"], snapshot.position, replayed)


def _fold_in_log(learner: Learner, up_to: int) -> int:
    """Fold the log after ``learner.applied`` up to ``up_to`` into the learner, batch by
    batch as it was stored, without evaluating it; returns the events folded in."""
    evaluate, learner.evaluate = learner.evaluate, False
    replayed = 0
    try:
        while learner.applied < up_to:
            with learner.db.connect() as conn:
                batches = log_after(conn, learner.applied, up_to, TAIL_PAGE_EVENTS)
            if not batches:
                learner.applied = up_to
                break
            for batch in batches:
                learner.learn(batch.events, batch.position)
                replayed += len(batch.events)
    finally:
        learner.evaluate = evaluate
    return replayed


def _json_round_trip(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as it reads back from a JSON header (tuples become lists)."""
    return dict(json.loads(json.dumps(value, sort_keys=True)))
