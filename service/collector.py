"""The interpreter's garbage collector, tuned for a process that holds a large online state.

CPython collects its youngest generation after every 700 net new container objects
(lists, dicts, tuples, sets), every tenth of those collections the next, and so on up
to full collections over everything. The ingest path makes thousands of containers a
batch when its events come from many users (per-user sets of rated items, the published
views' map nodes, the batch's lists), most of them freed by reference counting within
the batch; at the default they set off many young collections a batch and, every few
batches, a full one over the whole online state (figures: ``docs/decisions/0007``).

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
