"""Event retention: the log's oldest events move to the object store as Parquet partitions.

Every ``RETENTION_INTERVAL_S`` the cluster's leader (in one process: that process)
archives the events past ``EVENT_RETENTION`` (``service.settings.retention``), one
partition of at most ``partition_rows`` events at a time, in three steps:

1. **write** the partition's object (``service.store.partitions``), whose key names its
   first and last ids, and the archive's uniform sample at its last id
   (``service.store.archive_sample``);
2. **record** it in ``event_archives`` (under the leader's fencing token), which moves
   the archive's boundary past its events: from now on readers take them from the
   object (``service.store.eventlog``);
3. **delete** its events from ``events`` in transactions of ``RETENTION_BATCH_ROWS``,
   each holding the write lock a few milliseconds, so ingestion goes on between them;
   then mark the partition purged.

A crash between the steps loses nothing and leaves one copy. Before 1 is recorded, the
next run starts from the same first event and writes the same key again (or, when the
retention has moved on meanwhile, a longer partition from the same first event, and the
shorter object is deleted once the longer one is recorded); after 2, the next run
finishes the deletes before archiving anything else.

What is never archived, whatever the policy says (``target``):

- events stored less than ``RETENTION_DEDUP_HORIZON_S`` ago: ``event_id``'s unique index
  on ``events`` is what refuses a redelivered event, so it does for that long at least;
- the newest ``keep_newest`` events, and always the newest one: a restarted replica
  reloads its rated and popular items from the newest events of the table
  (``SERVING_HISTORY_PAIRS``, ``POPULAR_WINDOW``), and SQLite numbers a new event after
  the newest row it holds;
- events after the oldest online snapshot's position: a replica restoring from one
  folds in the table's events after it;
- anything at all while no model version has been published: a replica without one
  replays the whole table.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, delete, func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from functions.artifacts import sha256_hex
from functions.objectstore import ObjectStore
from service.background import BackgroundLoop
from service.settings.retention import RetentionPolicy
from service.store import Database, archive_sample, archives
from service.store.archives import Partition
from service.store.eventlog import EventLog
from service.store.events import LabelledEvents, max_event_id
from service.store.leases import NotLeaseHolder, check_fencing
from service.store.partitions import ArchivedRows, encode, key_prefix, partition_key
from service.store.tables import events, model_versions, online_snapshots

log = logging.getLogger(__name__)

#: Events per archived partition at most.
PARTITION_ROWS = 100_000
#: Events deleted per transaction by backend, unless the options say: SQLite's one write
#: lock stops ingestion for as long as a delete holds it, while a PostgreSQL delete of
#: old rows blocks no insert and costs mostly its commit.
BATCH_ROWS = {"sqlite": 1_000, "postgresql": 10_000}
#: Events deleted per transaction on any other backend.
FALLBACK_BATCH_ROWS = 1_000
#: Seconds the archiver rests per second of work: it drains a backlog at a quarter of
#: its full speed (some 10,000 events/s on SQLite), far above any steady ingest rate,
#: and leaves ingestion three quarters of the time.
REST_RATIO = 3.0


@dataclass(frozen=True)
class RetentionOptions:
    """What the archiver keeps and how it deletes.

    Parameters
    ----------
    policy
        ``EVENT_RETENTION``: the events older than it (or past its count) go.
    dedup_horizon_s
        Events stored less than this many seconds ago stay, whatever ``policy`` says.
    keep_newest
        The newest this many events stay, whatever ``policy`` says.
    batch_rows
        Events deleted per transaction (None: ``BATCH_ROWS`` for the database's backend).
    partition_rows
        Events per archived partition at most.
    pause_s
        Seconds at least between two delete transactions (and as long as the last one
        took), so the writers waiting on the lock take it in between.
    sample_size, sample_seed
        The archive's uniform sample kept beside it for job windows
        (``service.store.archive_sample``): its size (0: none) and seed.
    """

    policy: RetentionPolicy
    dedup_horizon_s: float = 86_400.0
    keep_newest: int = 0
    batch_rows: int | None = None
    partition_rows: int = PARTITION_ROWS
    pause_s: float = 0.02
    sample_size: int = 0
    sample_seed: int = 0

    def __post_init__(self) -> None:
        if self.dedup_horizon_s < 0:
            raise ValueError(f"dedup_horizon_s must be >= 0, got {self.dedup_horizon_s}")
        if self.keep_newest < 0:
            raise ValueError(f"keep_newest must be >= 0, got {self.keep_newest}")
        if (self.batch_rows is not None and self.batch_rows < 1) or self.partition_rows < 1:
            raise ValueError("batch_rows and partition_rows must be >= 1")
        if self.sample_size < 0:
            raise ValueError(f"sample_size must be >= 0, got {self.sample_size}")


@dataclass
class RetentionRun:
    """What one run did: partitions archived, events deleted, the boundary after it."""

    partitions: list[str] = field(default_factory=list)
    deleted: int = 0
    boundary: int = 0


class Archiver:
    """Archives the events past the retention; runs on its own thread while leading.

    Ownership: ``run_once`` on one thread at a time (the archiver's, or a caller's when
    the thread is not started).
    """

    def __init__(
        self,
        db: Database,
        store: ObjectStore,
        options: RetentionOptions,
        *,
        leading: Callable[[], bool] = lambda: True,
        fencing_token: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.store = store
        self.options = options
        self.leading = leading
        self.fencing_token = fencing_token
        self.clock = clock
        self.batch_rows = options.batch_rows or BATCH_ROWS.get(
            db.engine.dialect.name, FALLBACK_BATCH_ROWS
        )
        self._loop = BackgroundLoop("retention")
        #: The boundary and sample this archiver wrote last (the next one builds on it).
        self._last_sample: tuple[int, LabelledEvents] | None = None

    # -- one run ----------------------------------------------------------------------
    def run_once(self) -> RetentionRun:
        """Finish any partition a previous run recorded but did not delete, then archive
        partitions until nothing more is due (or this process stops leading)."""
        run = RetentionRun()
        with self.db.connect() as conn:
            pending = archives.unpurged(conn)
        for partition in pending:
            run.deleted += self._purge(partition)
        while self.leading() and not self._loop.stopped.is_set():
            started = time.perf_counter()
            with self.db.connect() as conn:
                after = archives.boundary(conn)
                rows = self._due_rows(conn, after)
            if not rows:
                break
            archived = ArchivedRows.of(rows)
            del rows
            partition = self._write(archived)
            self._write_sample(after, partition, archived)
            del archived
            self._rest(started)
            if not self._record(partition):
                break
            self._sweep(partition)
            self._prune_samples(after, partition.last_id)
            run.partitions.append(partition.key)
            run.deleted += self._purge(partition)
        with self.db.connect() as conn:
            run.boundary = archives.boundary(conn)
        if run.partitions:
            log.info(
                "archived %d partitions of the event log (%d events deleted); boundary %d",
                len(run.partitions),
                run.deleted,
                run.boundary,
            )
        return run

    def target(self, conn: Connection) -> int:
        """The newest event id that may be archived now (0: none)."""
        head = max_event_id(conn)
        if head == 0 or not _has_version(conn):
            return 0
        options, now = self.options, self.clock()
        bounds = [head]
        if options.policy.seconds is not None:
            bounds.append(_stored_before(conn, now - options.policy.seconds))
        # The newest event always stays: SQLite numbers a new row after the newest one.
        keep = max(options.policy.events or 0, options.keep_newest, 1)
        bounds.append(_before_newest(conn, keep))
        if options.dedup_horizon_s > 0:
            bounds.append(_stored_before(conn, now - options.dedup_horizon_s))
        oldest_snapshot = conn.scalar(select(func.min(online_snapshots.c.position)))
        if oldest_snapshot is not None:
            bounds.append(int(oldest_snapshot))
        return max(0, min(bounds))

    def _due_rows(self, conn: Connection, after: int) -> Sequence[Sequence]:
        """The next partition's rows: the first ``partition_rows`` after ``after`` up to
        the target."""
        target = self.target(conn)
        if target <= after:
            return []
        query = (
            select(
                events.c.id,
                events.c.event_id,
                events.c.user_id,
                events.c.item_id,
                events.c.rating,
                events.c.timestamp,
                events.c.ingested_at,
            )
            .where(events.c.id > after, events.c.id <= target)
            .order_by(events.c.id)
            .limit(self.options.partition_rows)
        )
        return conn.execute(query).all()

    # -- the three steps ----------------------------------------------------------------
    def _write(self, rows: ArchivedRows) -> Partition:
        """Step 1: the partition's object."""
        data = encode(rows)
        ids = rows.ids
        first, last = int(ids[0]), int(ids[-1])
        partition = Partition(
            first_id=first,
            last_id=last,
            key=partition_key(first, last),
            checksum=sha256_hex(data),
            size=len(data),
            events=len(rows),
            labelled=rows.labelled_count,
            first_ingested_at=rows.ingested_at(0),
            last_ingested_at=rows.ingested_at(len(rows) - 1),
        )
        self.store.put(partition.key, data)
        return partition

    def _write_sample(self, after: int, partition: Partition, rows: ArchivedRows) -> None:
        """Step 1 for the archive's sample: the sample at the partition's boundary, the
        lowest of the one at ``after`` and the partition's own lowest."""
        size, seed = self.options.sample_size, self.options.sample_seed
        if size == 0:
            return
        both = LabelledEvents.concat_all([self._sample_at(after), rows.lowest(size, seed)])
        sample = archive_sample.lowest(both, size, seed)
        archive_sample.write(self.store, seed, size, partition.last_id, sample)
        self._last_sample = (partition.last_id, sample)

    def _sample_at(self, boundary: int) -> LabelledEvents:
        """The archive's sample at ``boundary``: the one this archiver wrote last, the
        stored one, or (retention began without one, or with another seed or size) drawn
        once from the partitions."""
        size, seed = self.options.sample_size, self.options.sample_seed
        if boundary == 0:
            return LabelledEvents.from_rows([])
        if self._last_sample is not None and self._last_sample[0] == boundary:
            return self._last_sample[1]
        stored = archive_sample.read(self.store, seed, boundary, size)
        if stored is not None:
            return stored
        with self.db.connect() as conn:
            return EventLog(self.store).uniform_sample(conn, boundary, size, seed)

    def _prune_samples(self, previous: int, boundary: int) -> None:
        """Keep the samples at the new boundary and the one before it (a reader that saw
        the previous boundary reads its sample), delete the rest."""
        if self.options.sample_size:
            archive_sample.prune(self.store, self.options.sample_seed, {previous, boundary})

    def _record(self, partition: Partition) -> bool:
        """Step 2: the record, under the leader's token; False when another archiver
        recorded a partition from the same event first."""
        try:
            with self.db.begin() as conn:
                if self.fencing_token is not None:
                    check_fencing(conn, self.fencing_token())
                archives.record(conn, partition)
        except IntegrityError:
            log.warning("partition %s was archived by another process", partition.key)
            return False
        except NotLeaseHolder:
            log.info("partition %s not recorded: this process no longer leads", partition.key)
            return False
        return True

    def _sweep(self, partition: Partition) -> None:
        """Objects of partitions from the same first event that were written but never
        recorded (a run that stopped before step 2, when the retention reached less far)."""
        for key in self.store.list(key_prefix(partition.first_id)):
            if key != partition.key:
                self.store.delete(key)

    def _purge(self, partition: Partition) -> int:
        """Step 3: delete the partition's events, a range of ``batch_rows`` ids per
        transaction; then mark it purged. Returns the events deleted."""
        deleted, low = 0, partition.first_id
        while low <= partition.last_id:
            if self._loop.stopped.is_set():
                return deleted
            high = min(low + self.batch_rows, partition.last_id + 1)
            started = time.perf_counter()
            with self.db.begin() as conn:
                span = delete(events).where(events.c.id >= low, events.c.id < high)
                deleted += conn.execute(span).rowcount
            low = high
            if low <= partition.last_id:
                self._rest(started)
        with self.db.begin() as conn:
            archives.mark_purged(conn, partition.first_id)
        return deleted

    def _rest(self, started: float) -> None:
        """Sleep ``REST_RATIO`` times as long as the step begun at ``started`` took, and
        ``pause_s`` at least.

        The archiver runs beside ingestion (in its process, sharing its interpreter's
        lock, and on SQLite its write lock): it takes at most a quarter of either. A
        writer waiting on SQLite's lock sleeps in growing steps, and a pause shorter than
        its step would let the next delete take the lock first, again and again.
        """
        took = time.perf_counter() - started
        self._loop.stopped.wait(max(self.options.pause_s, REST_RATIO * took))

    # -- the thread ---------------------------------------------------------------------
    def start(self, interval_s: float) -> None:
        """Run every ``interval_s`` on a thread of its own, while this process leads."""
        self._loop.start(functools.partial(self._run, interval_s))

    def stop(self) -> None:
        """Stop after the delete transaction in flight (the next run finishes it)."""
        self._loop.stop()

    def _run(self, interval_s: float) -> None:
        while not self._loop.stopped.wait(interval_s):
            if not self.leading():
                continue
            try:
                self.run_once()
            except SQLAlchemyError:
                log.warning("retention: database unreachable; trying next time", exc_info=True)
            except Exception:  # the archiver must outlive a bad run; the next one resumes
                log.exception("retention: archiving the event log failed")


def _has_version(conn: Connection) -> bool:
    """Whether a version with its artifact exists (without one a replica replays the
    whole table at start)."""
    query = select(model_versions.c.version).where(model_versions.c.deleted_at.is_(None))
    return conn.execute(query.limit(1)).first() is not None


def _before_newest(conn: Connection, keep: int) -> int:
    """The id just older than the newest ``keep`` events (0: no more are stored)."""
    query = select(events.c.id).order_by(events.c.id.desc()).offset(keep).limit(1)
    return int(conn.scalar(query) or 0)


def _stored_before(conn: Connection, cutoff: float) -> int:
    """The newest id stored before ``cutoff`` (seconds since 1970; 0: none), by a
    binary search over ids: ``ingested_at`` grows with the id, so no index is needed
    on it (and ingestion pays for none)."""
    first = conn.execute(
        select(events.c.id, events.c.ingested_at).order_by(events.c.id).limit(1)
    ).first()
    if first is None or first[1] >= cutoff:
        return 0
    older, newer = int(first[0]), max_event_id(conn) + 1
    while newer - older > 1:
        middle = (older + newer) // 2
        found = conn.execute(
            select(events.c.id, events.c.ingested_at)
            .where(events.c.id >= middle, events.c.id < newer)
            .order_by(events.c.id)
            .limit(1)
        ).first()
        if found is not None and found[1] < cutoff:
            older = int(found[0])
        else:
            newer = middle
    return older
