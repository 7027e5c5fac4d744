"""A batch's ids as the ingest path hands them over: each distinct one met once.

The service passes a batch's ids as ``functions.ids.Ids``, a sequence that factorizes
itself once (``distinct()``) for every stage to share. The drift package imports no
other Driftline package, so it takes that by its method: any other sequence of strings
is factorized here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["distinct", "repeats"]


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
