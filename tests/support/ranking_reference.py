"""The rank of an item by its definition, for equivalence tests of the compiled ranking."""

from __future__ import annotations

import numpy as np

from drift.ranking import NOT_RANKED


def reference_rank(scores: np.ndarray, target: int, excluded: set[int]) -> int:
    """1 + the items not left out that score above the target, or equal from a lower
    row; ``NOT_RANKED`` for an unknown or left-out target."""
    if target < 0 or target in excluded:
        return NOT_RANKED
    chosen = scores[target]
    ahead = sum(
        1
        for i, score in enumerate(scores.tolist())
        if i not in excluded and (score > chosen or (score == chosen and i < target))
    )
    return 1 + ahead
