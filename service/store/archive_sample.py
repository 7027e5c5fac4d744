"""The archive's uniform sample, kept up to date by the archiver.

Every job's window holds a uniform sample of older history (``retrain.window``): the
``size`` labelled events ranked lowest by a hash of their id and the job's seed
(``events.uniform_labelled``). Drawn from the archive by reading it, that costs every
partition: minutes at 10⁷ events, while a drift the job answers keeps costing accuracy.

So for the seed and size the settings give jobs (``SEED``, ``HISTORY_SAMPLE``), the
archiver keeps the archive's ``size`` lowest-ranked labelled events as one object per
boundary, ``events/archive-samples/seed-<seed>/<boundary>-<size>.parquet``: the sample
at the new boundary is the lowest of the previous sample and the new partition's events,
written before the partition is recorded, so a reader that sees a boundary finds its
sample. The lowest ``n`` of a set are among the lowest ``size`` of any superset, for
``n <= size``: the stored sample answers every draw of that seed and at most that size
exactly, over the whole archive or any prefix of it that still holds ``n`` of the
sample's events. Anything else is read from the partitions (``service.store.eventlog``).

Samples hold only what the partitions hold and are rewritten whole at each boundary; the
archiver keeps the newest two (a reader that saw the previous boundary still finds its
sample) and deletes the rest.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from functions.objectstore import ObjectNotFound, ObjectStore, validate_key
from service.store.events import LabelledEvents, lowest_ranks

#: Object store prefix of the archive's samples.
SAMPLE_PREFIX = "events/archive-samples/"

_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("item_id", pa.string(), nullable=False),
        pa.field("rating", pa.float64(), nullable=False),
    ]
)
_KEY = re.compile(r"(\d{20})-(\d+)\.parquet$")


def sample_key(seed: int, boundary: int, size: int) -> str:
    """The sample of the archive up to ``boundary`` for ``seed`` and ``size``.

    >>> sample_key(0, 5000, 50000)
    'events/archive-samples/seed-0/00000000000000005000-50000.parquet'
    """
    return validate_key(f"{_seed_prefix(seed)}{boundary:020d}-{size}.parquet")


def lowest(events: LabelledEvents, size: int, seed: int) -> LabelledEvents:
    """The events of ``size`` lowest ranks among ``events`` (in id order), in id order."""
    if len(events) <= size:
        return events
    kept = np.sort(lowest_ranks(events.ids, size, seed))
    return take(events, np.searchsorted(events.ids, kept))


def take(events: LabelledEvents, rows: np.ndarray) -> LabelledEvents:
    """The events at ``rows`` (positions, ascending)."""
    if len(rows) == len(events):
        return events
    return LabelledEvents(
        ids=events.ids[rows],
        user_ids=[events.user_ids[r] for r in rows],
        item_ids=[events.item_ids[r] for r in rows],
        ratings=events.ratings[rows],
    )


def write(store: ObjectStore, seed: int, size: int, boundary: int, sample: LabelledEvents) -> None:
    """Store ``sample``, the archive's lowest ``size`` up to ``boundary``."""
    table = pa.Table.from_arrays(
        [
            pa.array(sample.ids, pa.int64()),
            pa.array(sample.user_ids, pa.string()),
            pa.array(sample.item_ids, pa.string()),
            pa.array(sample.ratings, pa.float64()),
        ],
        schema=_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    store.put(sample_key(seed, boundary, size), sink.getvalue())


def read(store: ObjectStore, seed: int, boundary: int, size: int) -> LabelledEvents | None:
    """The stored sample of exactly ``size`` at ``boundary`` (None: none stored)."""
    try:
        data = store.get(sample_key(seed, boundary, size))
    except ObjectNotFound:
        return None
    table = pq.read_table(io.BytesIO(data), schema=_SCHEMA)
    return LabelledEvents(
        ids=table.column("id").to_numpy(),
        user_ids=table.column("user_id").to_pylist(),
        item_ids=table.column("item_id").to_pylist(),
        ratings=table.column("rating").to_numpy(),
    )


def draw(
    store: ObjectStore, seed: int, boundary: int, up_to_id: int, size: int
) -> LabelledEvents | None:
    """The ``size`` lowest-ranked labelled events of the archive with ``id <= up_to_id``
    (``boundary`` the archive's), from a stored sample; None when none answers exactly."""
    for stored_size in _sizes(store, seed, boundary):
        if stored_size < size:
            continue
        sample = read(store, seed, boundary, stored_size)
        if sample is None:
            continue
        held = int(np.searchsorted(sample.ids, up_to_id, side="right"))
        # Exact when the prefix holds enough, or when the sample is the whole archive.
        if held >= size or len(sample) < stored_size:
            return lowest(take(sample, np.arange(held)), size, seed)
    return None


def prune(store: ObjectStore, seed: int, keep: set[int]) -> None:
    """Delete the samples of ``seed`` at boundaries other than ``keep``'s."""
    for key in store.list(_seed_prefix(seed)):
        found = _KEY.search(key)
        if found is None or int(found.group(1)) not in keep:
            store.delete(key)


def _sizes(store: ObjectStore, seed: int, boundary: int) -> list[int]:
    """The sizes stored at ``boundary``, smallest first."""
    keys = store.list(f"{_seed_prefix(seed)}{boundary:020d}-")
    return sorted(int(m.group(2)) for key in keys if (m := _KEY.search(key)) is not None)


def _seed_prefix(seed: int) -> str:
    return f"{SAMPLE_PREFIX}seed-{seed}/"
