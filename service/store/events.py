"""Writing and reading events.

Ingestion is atomic and idempotent: a batch is stored in one transaction, and an event
whose ``event_id`` is already stored (or repeated inside the batch) counts as a duplicate
instead of being stored twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Result, func, select

from service.store import archives
from service.store.prepared import Prepared
from service.store.tables import events

_COLUMNS = ("event_id", "user_id", "item_id", "rating", "timestamp", "ingested_at")


@dataclass(slots=True, unsafe_hash=True)
class NewEvent:
    """An event as validated by the API or the Kafka consumer, before it is stored.

    Never changed once made, but not a frozen dataclass: a frozen one sets each field
    through ``object.__setattr__``, which made building the events about half of
    validating a batch. Slots keep reading a field cheap: the store reads five per event.
    """

    user_id: str
    item_id: str
    rating: float | None = None
    timestamp: float | None = None
    event_id: str | None = None

    @classmethod
    def columns(
        cls,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        ratings: Sequence[float | None],
        timestamps: Sequence[float | None],
        event_ids: Sequence[str | None],
    ) -> list[NewEvent]:
        """The events of five checked columns of equal length, one per row."""
        if not len(user_ids) == len(item_ids) == len(ratings) == len(timestamps):
            raise ValueError("the columns differ in length")
        if len(event_ids) != len(user_ids):
            raise ValueError("the columns differ in length")
        return list(map(cls, user_ids, item_ids, ratings, timestamps, event_ids))


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    """What a batch did to the store: the events newly stored (in order) and the rest.

    ``log_before`` is the newest event id before the batch and ``position`` the newest
    after it: the events other processes stored before this batch are those with
    ``applied < id <= log_before`` (``service.store.events`` keeps ids in commit order).
    """

    stored: list[NewEvent]
    duplicates: int
    log_before: int = 0
    position: int = 0

    @property
    def accepted(self) -> int:
        return len(self.stored)


#: Rows converted to columns at a time (``LabelledEvents.from_result``).
_COLUMN_CHUNK = 1_000
#: Rows a page of ``labelled_events`` reads, and the id no event reaches.
_PAGE_ROWS = 5_000
_NO_BOUND = 2**63 - 1


@dataclass(frozen=True, slots=True)
class LabelledEvents:
    """Labelled events as parallel columns, ready for vectorised training or evaluation."""

    ids: np.ndarray
    user_ids: list[str]
    item_ids: list[str]
    ratings: np.ndarray

    def __len__(self) -> int:
        return len(self.user_ids)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence]) -> LabelledEvents:
        return cls(
            ids=np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
            user_ids=[r[1] for r in rows],
            item_ids=[r[2] for r in rows],
            ratings=np.fromiter((r[3] for r in rows), dtype=np.float64, count=len(rows)),
        )

    @classmethod
    def from_result(cls, result: Result, chunk: int = _COLUMN_CHUNK) -> LabelledEvents:
        """Columns of a query's rows, converted ``chunk`` rows at a time.

        Materialising a large window first keeps every row object alive long enough
        for the garbage collector to promote it to its oldest generation, and the full
        collections that follow pause every request of a serving process; rows that die
        young cost nothing. The rows come ``fetchmany`` at a time, not one by one.
        """
        parts = []
        while rows := result.fetchmany(chunk):
            parts.append(cls.from_rows(rows))
        return cls.concat_all(parts)

    @classmethod
    def concat_all(cls, parts: Sequence[LabelledEvents]) -> LabelledEvents:
        """One set of columns from ``parts``, in their order."""
        if not parts:
            return cls.from_rows([])
        return cls(
            ids=np.concatenate([p.ids for p in parts]),
            user_ids=[u for p in parts for u in p.user_ids],
            item_ids=[i for p in parts for i in p.item_ids],
            ratings=np.concatenate([p.ratings for p in parts]),
        )


#: The advisory lock PostgreSQL writers of events hold to the end of their transaction.
_LOG_LOCK = 0x44524654  # "DRFT"

_INSERT_COLUMNS = ",".join(_COLUMNS)
#: SQLite: rows per multi-row ``INSERT`` (6 parameters each, within the 999 that every
#: SQLite build allows). A batch goes as a few such statements (``_sqlite_chunks``).
_SQLITE_ROWS_PER_INSERT = 128
#: The multi-row ``INSERT`` of each size used, made once (the driver then reuses the
#: prepared statement by its text).
_SQLITE_INSERTS: dict[int, str] = {}
_SKIP_STORED = "ON CONFLICT (event_id) DO NOTHING"
#: PostgreSQL: the batch as five arrays, one statement of the same text whatever the
#: batch size (so psycopg prepares it once per connection), rows in the batch's order.
_POSTGRESQL_INSERT = (
    f"INSERT INTO events ({_INSERT_COLUMNS}) "
    "SELECT k, u, i, r, t, %s FROM unnest("
    "%s::text[], %s::text[], %s::text[], %s::float8[], %s::float8[]"
    ") WITH ORDINALITY AS batch (k, u, i, r, t, n) ORDER BY n "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id, id"
)


@dataclass(frozen=True, slots=True)
class _Inserted:
    """What one insert did: the newest id before it and after it, and the keys of the
    rows it stored (None: every row it was given)."""

    log_before: int
    position: int
    keys: set[str] | None


def store_events(conn: Connection, batch: Sequence[NewEvent]) -> IngestOutcome:
    """Store the events of ``batch`` not stored before; run inside the caller's transaction.

    The unique index on ``event_id`` decides what is a duplicate (an id stored before,
    by any writer, or repeated inside the batch: the first copy wins), so concurrent
    writers can never both store an id. An event without an id gets a fresh one.

    The events table is the cluster's log: replicas apply it in id order, so ids must
    become visible in the order they were given. On PostgreSQL, writers take one
    transaction-scoped advisory lock before their first insert and commit in turn (a
    sequence alone hands out ids that concurrent transactions commit out of order, and
    a reader following ``id > last`` would skip the late ones for good); on SQLite the
    transaction takes the database's one write lock before it reads the newest id.
    Either way ``log_before`` is exact: no other writer's event lies between it and
    this batch's first id.

    The batch goes to the database in a few statements: multi-row ``INSERT``s on SQLite
    (``_sqlite_insert_rows``), five arrays through ``unnest`` on PostgreSQL
    (``_POSTGRESQL_INSERT``).
    """
    unique: dict[str, NewEvent] = {}
    for event in batch:
        unique.setdefault(event.event_id or uuid.uuid4().hex, event)
    if not unique:
        newest = max_event_id(conn)
        return IngestOutcome([], 0, newest, newest)
    insert = _sqlite_insert if conn.dialect.name == "sqlite" else _postgresql_insert
    inserted = insert(conn, unique, time.time())
    if inserted.keys is None:
        fresh = list(unique.values())
    else:
        fresh = [event for key, event in unique.items() if key in inserted.keys]
    return IngestOutcome(fresh, len(batch) - len(fresh), inserted.log_before, inserted.position)


def _sqlite_insert(conn: Connection, unique: dict[str, NewEvent], now: float) -> _Inserted:
    """Insert on SQLite: take the write lock, read the newest id, insert the rows.

    ``BEGIN IMMEDIATE`` takes the lock up front (the driver would only begin at the
    insert, after the newest id was read outside the transaction, where another
    process could still commit). When every row was stored (the driver counts them),
    none needs reading back; otherwise the rows above the newest id are this batch's
    (new rowids exceed every stored one, and no other writer runs meanwhile), and when
    all were, the last one's rowid is the newest id.
    """
    if not _in_sqlite_transaction(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    log_before = max_event_id(conn)
    rows = [(key, e.user_id, e.item_id, e.rating, e.timestamp, now) for key, e in unique.items()]
    stored, last_id = _sqlite_insert_rows(conn, rows)
    if stored == len(rows):
        return _Inserted(log_before, last_id, None)
    found = conn.exec_driver_sql(
        "SELECT event_id, id FROM events WHERE id > ? ORDER BY id", (log_before,)
    ).all()
    position = int(found[-1][1]) if found else log_before
    return _Inserted(log_before, position, {row[0] for row in found})


def _sqlite_insert_rows(conn: Connection, rows: list[tuple]) -> tuple[int, int]:
    """Insert ``rows`` in order with a few multi-row statements; the rows stored and
    the rowid of the last row the last statement stored.

    Few statements, not one per row: the driver lets other threads run during each
    statement it steps, and taking the interpreter back while another thread computes
    (a retrain, the serving index's build, a request) waits up to the switch interval,
    so the number of statements, not of rows, sets that wait (``docs/decisions/0007``).
    """
    stored, last_id, start = 0, 0, 0
    for size in _sqlite_chunks(len(rows)):
        values = tuple(value for row in rows[start : start + size] for value in row)
        result = conn.exec_driver_sql(_sqlite_insert_of(size), values)
        stored += result.rowcount
        last_id = result.lastrowid or last_id
        start += size
    return stored, last_id


def _sqlite_chunks(n: int) -> list[int]:
    """``n`` rows as statement sizes: full ones of ``_SQLITE_ROWS_PER_INSERT`` rows, then
    the rest by powers of two, so that every batch uses a handful of statement texts."""
    sizes = [_SQLITE_ROWS_PER_INSERT] * (n // _SQLITE_ROWS_PER_INSERT)
    rest = n % _SQLITE_ROWS_PER_INSERT
    sizes += [1 << bit for bit in reversed(range(rest.bit_length())) if rest >> bit & 1]
    return sizes


def _sqlite_insert_of(size: int) -> str:
    """The ``INSERT`` of ``size`` rows that skips an ``event_id`` stored before."""
    sql = _SQLITE_INSERTS.get(size)
    if sql is None:
        rows = ",".join(["(?,?,?,?,?,?)"] * size)
        sql = f"INSERT INTO events ({_INSERT_COLUMNS}) VALUES {rows} {_SKIP_STORED}"
        _SQLITE_INSERTS[size] = sql
    return sql


def _in_sqlite_transaction(conn: Connection) -> bool:
    """Whether the SQLite driver has begun a transaction on ``conn`` (it begins one
    only at the first write, whatever the caller's ``begin()``)."""
    return bool(conn.connection.dbapi_connection.in_transaction)  # type: ignore[union-attr]


def _postgresql_insert(conn: Connection, unique: dict[str, NewEvent], now: float) -> _Inserted:
    """Insert on PostgreSQL: the log's advisory lock, the newest id, then one statement.

    The lock comes first, in its own statement: the newest id must be read in a
    snapshot taken once the lock is held. ``RETURNING`` names the rows stored.
    """
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_LOG_LOCK})")
    log_before = max_event_id(conn)
    events = list(unique.values())
    columns = (
        now,
        list(unique),
        [e.user_id for e in events],
        [e.item_id for e in events],
        [None if e.rating is None else float(e.rating) for e in events],
        [None if e.timestamp is None else float(e.timestamp) for e in events],
    )
    found = conn.exec_driver_sql(_POSTGRESQL_INSERT, columns).all()
    position = max((int(row[1]) for row in found), default=log_before)
    return _Inserted(log_before, position, {row[0] for row in found})


def count_events(conn: Connection, labelled_only: bool = False, up_to_id: int | None = None) -> int:
    """Events of the log (labelled ones with ``labelled_only``) up to ``up_to_id``,
    archived ones included (``service.store.archives``).

    Exact for an ``up_to_id`` at or past the archive's boundary (the learner counts up
    to the head); inside the archive, the partitions wholly before it count. The table
    is counted after the boundary only, and again should the boundary move meanwhile.
    """
    while True:
        boundary = archives.boundary(conn)
        query = select(func.count()).select_from(events).where(events.c.id > boundary)
        if labelled_only:
            query = query.where(events.c.rating.is_not(None))
        if up_to_id is not None:
            query = query.where(events.c.id <= up_to_id)
        stored = int(conn.scalar(query) or 0)
        if archives.boundary(conn) == boundary:
            break
    if boundary == 0:
        return stored
    up_to = boundary if up_to_id is None else min(boundary, up_to_id)
    return stored + archives.archived_count(conn, up_to, labelled_only=labelled_only)


#: Read twice per stored batch: SQLAlchemy building and running it cost more than the
#: database's look-up of the newest rowid.
_MAX_EVENT_ID = Prepared(select(func.max(events.c.id)))


def max_event_id(conn: Connection) -> int:
    """The newest row id, 0 for an empty store; the boundary a model version records."""
    return int(_MAX_EVENT_ID.scalar(conn) or 0)


def labelled_events(
    conn: Connection, after_id: int = 0, up_to_id: int | None = None
) -> LabelledEvents:
    """Labelled events with ``after_id < id <= up_to_id``, in arrival order.

    Read a page of ``_PAGE_ROWS`` at a time by id (keyset pagination), as the driver's
    tuples: a swap's replay reads 50,000 events beside ``/recommend``'s threads, and
    SQLAlchemy's ``Row`` objects took five times the driver's own fetch. Pages keep the
    rows alive briefly, so they never reach the collector's oldest generation.
    """
    marker = _marker(conn)
    sql = (
        f"SELECT id, user_id, item_id, rating FROM events WHERE id > {marker} "
        f"AND id <= {marker} AND rating IS NOT NULL ORDER BY id LIMIT {_PAGE_ROWS}"
    )
    bound = _NO_BOUND if up_to_id is None else up_to_id
    return LabelledEvents.concat_all(
        [LabelledEvents.from_rows(rows) for rows in _pages(conn, sql, after_id, bound)]
    )


#: Ids read per round trip while drawing a uniform sample, and ids per ``IN`` list when
#: fetching it (within SQLite's and PostgreSQL's bound-parameter limits).
_SAMPLE_READ_IDS = 50_000
_SAMPLE_FETCH_IDS = 1_000


def uniform_labelled(
    conn: Connection, up_to_id: int, size: int, seed: int, after_id: int = 0
) -> LabelledEvents:
    """A uniform sample of ``size`` labelled events with ``after_id < id <= up_to_id``,
    in id order (every one of them when there are fewer).

    Each event ranks by a hash of its id and ``seed`` (SplitMix64) and the ``size``
    lowest ranks are kept: a draw without replacement in which every event is as likely
    as any other, which the same seed reproduces exactly (a resumed job rebuilds the
    same window), and which holds the sample in memory, not the history: ids are read
    ``_SAMPLE_READ_IDS`` at a time, by keyset pagination.
    """
    if size <= 0 or up_to_id <= 0:
        return LabelledEvents.from_rows([])
    marker = _marker(conn)
    ids_sql = (
        f"SELECT id FROM events WHERE id > {marker} AND id <= {marker} "
        f"AND rating IS NOT NULL ORDER BY id LIMIT {_SAMPLE_READ_IDS}"
    )
    kept = np.empty(0, dtype=np.int64)
    for part in _pages(conn, ids_sql, after_id, up_to_id):
        ids = np.concatenate([kept, np.fromiter((row[0] for row in part), np.int64, len(part))])
        kept = lowest_ranks(ids, size, seed)
    chosen = np.sort(kept).tolist()
    parts = []
    for start in range(0, len(chosen), _SAMPLE_FETCH_IDS):
        some = chosen[start : start + _SAMPLE_FETCH_IDS]
        listed = ",".join([marker] * len(some))
        sql = f"SELECT id, user_id, item_id, rating FROM events WHERE id IN ({listed}) ORDER BY id"
        parts.append(LabelledEvents.from_rows(_driver_rows(conn, sql, tuple(some))))
    return LabelledEvents.concat_all(parts)


def _pages(conn: Connection, sql: str, after_id: int, up_to_id: int) -> Iterator[list[tuple]]:
    """The pages of a keyset-paginated ``sql`` (its parameters: the id to read after and
    the highest id; its first column the id, ordered and limited), until one is empty."""
    while rows := _driver_rows(conn, sql, (after_id, up_to_id)):
        yield rows
        after_id = rows[-1][0]


def _driver_rows(conn: Connection, sql: str, params: tuple) -> list[tuple]:
    """The rows of ``sql`` as the driver's own tuples, in the connection's transaction.

    For the reads that return many rows on a serving process's threads: SQLAlchemy's
    ``Row`` costs several times the driver's own fetch per row
    (``docs/decisions/0004-serving-index-and-model-choices.md``).
    Callers page with ``LIMIT`` or bounded ``IN`` lists, so each result is small on
    every driver (psycopg's cursor holds the whole result client-side).
    """
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _marker(conn: Connection) -> str:
    """The driver's positional parameter marker: SQLite's ``?``, psycopg's ``%s``."""
    return "?" if conn.dialect.paramstyle == "qmark" else "%s"


def lowest_ranks(ids: np.ndarray, size: int, seed: int) -> np.ndarray:
    """The ``size`` of ``ids`` ranked lowest by ``uniform_labelled``'s hash (all of them
    when fewer), in no particular order: a sample drawn from parts is the lowest of the
    parts' lowest."""
    if ids.size <= size:
        return ids
    return ids[np.argpartition(_splitmix64(ids, seed), size - 1)[:size]]


def _splitmix64(ids: np.ndarray, seed: int) -> np.ndarray:
    """SplitMix64's output for each id offset by ``seed``: a bijection of 64-bit
    integers whose outputs look independent and uniform (Steele, Lea & Flood, 2014)."""
    offset = np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64)  # in Python: no scalar overflow
    z = ids.astype(np.uint64) + offset
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def labelled_id_from_end(conn: Connection, back: int) -> int | None:
    """Id of the labelled event ``back`` places before the newest one (0: the newest);
    None when fewer are stored, the archive's boundary when it lies in the archive.

    Where the ``n``-th labelled event sits when ``n`` is counted from the start but lies
    near the end: the index is read backwards ``back`` rows, not forwards ``n``.
    """
    query = (
        select(events.c.id)
        .where(events.c.rating.is_not(None))
        .order_by(events.c.id.desc())
        .offset(back)
        .limit(1)
    )
    found = conn.scalar(query)
    if found is None:
        # Walked past the table's oldest event: archived, or never stored. An archived
        # one stands at the boundary, so a drift window never reaches into the archive.
        return archives.boundary(conn) or None
    return int(found)


def rated_items(conn: Connection, user_id: str) -> list[str]:
    """Every item the user has an event for; recommendations leave these out."""
    query = select(events.c.item_id).where(events.c.user_id == user_id).distinct()
    return list(conn.scalars(query))


def recent_pairs(conn: Connection, limit: int | None) -> tuple[list[str], list[str]]:
    """Users and items of the newest ``limit`` events (all when None), oldest first.

    What a restarted service reloads its in-memory rated-items history from: as many
    pairs as that history keeps, so it comes back as it would have been.
    """
    query = select(events.c.user_id, events.c.item_id).order_by(events.c.id.desc())
    if limit is not None:
        query = query.limit(limit)
    rows = conn.execute(query).all()[::-1]
    return [row[0] for row in rows], [row[1] for row in rows]


@dataclass(frozen=True, slots=True)
class LogBatch:
    """Events one transaction stored, as the log holds them: ids, oldest first."""

    ids: list[int]
    events: list[NewEvent]

    @property
    def position(self) -> int:
        return self.ids[-1]


def log_after(
    conn: Connection, after_id: int, up_to_id: int | None = None, limit: int = _PAGE_ROWS
) -> list[LogBatch]:
    """The log from row ``after_id`` on, in the batches that stored it, oldest first:
    about ``limit`` events, none past ``up_to_id``; how replicas learn each other's events.

    A batch's events share their ``ingested_at``. Replicas learn each stored batch as
    one step, as the replica that stored it did, so they reach the same state; a page
    that ends inside a batch leaves that batch to the next read (unless it is the
    page's only one, larger than a page, and then learnt in parts).
    """
    return batches_of(log_rows(conn, after_id, up_to_id, limit), limit)


def log_rows(
    conn: Connection, after_id: int, up_to_id: int | None = None, limit: int = _PAGE_ROWS
) -> Sequence[Sequence]:
    """The first ``limit`` rows after ``after_id`` (none past ``up_to_id``) as
    ``batches_of`` takes them: id, user, item, rating, timestamp, event id, ingested at."""
    query = select(
        events.c.id,
        events.c.user_id,
        events.c.item_id,
        events.c.rating,
        events.c.timestamp,
        events.c.event_id,
        events.c.ingested_at,
    ).where(events.c.id > after_id)
    if up_to_id is not None:
        query = query.where(events.c.id <= up_to_id)
    return conn.execute(query.order_by(events.c.id).limit(limit)).all()


def batches_of(rows: Sequence[Sequence], limit: int) -> list[LogBatch]:
    """``log_after``'s batches of a page of rows (id, user, item, rating, timestamp,
    event id, ingested at), in id order; a page of ``limit`` rows leaves its last batch,
    which it may have cut, to the next read."""
    batches: list[LogBatch] = []
    stamp = None
    for row in rows:
        if row[6] != stamp or not batches:
            batches.append(LogBatch([], []))
            stamp = row[6]
        batches[-1].ids.append(int(row[0]))
        batches[-1].events.append(NewEvent(*row[1:6]))
    if len(rows) == limit and len(batches) > 1:
        batches.pop()  # cut by the page: read whole next time
    return batches


def pairs_after(
    conn: Connection, after_id: int, limit: int | None = None
) -> tuple[list[str], list[str]]:
    """Users and items of the events stored after row ``after_id`` (the newest ``limit``
    of them when given), oldest first: what other processes stored since a look."""
    query = (
        select(events.c.user_id, events.c.item_id)
        .where(events.c.id > after_id)
        .order_by(events.c.id.desc())
    )
    if limit is not None:
        query = query.limit(limit)
    rows = conn.execute(query).all()[::-1]
    return [row[0] for row in rows], [row[1] for row in rows]


def popular_items(conn: Connection, window: int, limit: int) -> list[tuple[str, int]]:
    """The items most users had events for among the newest ``window`` events.

    Counted in distinct users, not events: one user's events count once per item, so a
    client replaying one user's rating a thousand times moves an item no more than
    that user rating it once. (A client inventing users is held back by the per-key
    item cap, ``INGEST_ITEM_CAP``, at ingestion.)
    """
    newest = max_event_id(conn)
    count = func.count(events.c.user_id.distinct()).label("n")
    query = (
        select(events.c.item_id, count)
        .where(events.c.id > newest - window)
        .group_by(events.c.item_id)
        .order_by(count.desc(), events.c.item_id)
        .limit(limit)
    )
    return [(row[0], int(row[1])) for row in conn.execute(query)]
