"""A batch's ids as the ingest path hands them over: each distinct one met once.

The service passes a batch's ids as ``functions.ids.Ids``, a sequence that factorizes
itself once (``distinct()``) for every stage to share, and whose ids may carry integer
codes that tables look them up by (``look_up(table, get)``). The drift package imports
no other Driftline package, so it takes those by their methods: any other sequence of
strings is factorized, or looked up, here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat

import numpy as np

__all__ = ["distinct", "look_up", "repeats"]


def repeats(ids: Sequence[str]) -> bool:
    """Whether ``ids`` say they repeat enough for looking up only the distinct ones to
    pay (a batch's users do; a plain sequence says nothing)."""
    return bool(getattr(ids, "repeated", False))


def distinct(ids: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The distinct ids in order of first appearance and each id's index among them
    ``(n,)`` int64 (read-only when the sequence kept them)."""
    known = getattr(ids, "distinct", None)
    if known is not None:
        first, codes = known()
        return first, codes
    first = list(dict.fromkeys(ids))
    index = dict(zip(first, range(len(first)), strict=True))
    return first, np.fromiter(map(index.__getitem__, ids), dtype=np.int64, count=len(ids))


def look_up(ids: Sequence[str], table: object, get: Callable[[str, int], int | None]) -> np.ndarray:
    """``get(id, -1)`` of every id ``(n,)`` int64, a fresh array; by code from what
    ``table`` found for earlier batches when the sequence can (``table`` must then be
    renumbered as a new object: what it found is kept per object)."""
    coded = getattr(ids, "look_up", None)
    if coded is not None:
        found: np.ndarray = coded(table, get)
        return found
    return np.fromiter(map(get, ids, repeat(-1)), np.int64, count=len(ids))
