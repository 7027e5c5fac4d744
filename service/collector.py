"""The interpreter's garbage collector, tuned for a process that holds a large online state.

CPython collects its youngest generation after every 700 net new container objects
(lists, dicts, tuples, sets), and every tenth of those collections the next, and so on
to full collections over everything. The ingest path makes thousands of containers a
batch (per-user sets of rated items, the published views' map nodes, the batch's lists),
and most are freed by reference counting within the batch. At the default a batch of
2,000 events from 2,000 distinct users ran about 17 young collections, and every few
batches a full one over the whole online state: on a stream of 40,000 users and 300,000
items that was 30 % of the learning path (``docs/decisions/0007``). MovieLens-like
streams, a dozen users a batch, barely allocate and never noticed.

A larger first threshold lets a batch's temporaries come and go between collections;
the later generations' thresholds are left as they are, so full collections still run,
as rarely as CPython's own rule allows (when the long-lived objects grew by a quarter).
"""

from __future__ import annotations

import gc


def tune_collector(young_threshold: int) -> None:
    """Collect the youngest generation after ``young_threshold`` net new container
    objects (0 leaves the interpreter's setting); process-wide, set once at start-up."""
    if young_threshold <= 0:
        return
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
