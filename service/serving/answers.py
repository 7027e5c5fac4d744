"""Top-K answers kept for repeated requests, and the rule for when one stops holding.

A user's top-K depends on three things: their vector [p_u; b_u; s_u], their rated
items (excluded), and the items' vectors and online biases. The first two change only
with an event of that user, and ingestion replaces them (a new vector array in the
view's map, a new frozenset of rated items) rather than writing them in place, so an
identity check says whether either changed. The third changes a little with every
learnt batch, whoever rated, and wholesale at a swap.

So a kept answer is served while the user's vector and rated items are the very
objects it was computed from (the freshness contract: an acknowledged event of the
user is in their next answer), it is younger than ``max_age_s`` (how long other
users' events may go unreflected in it), and its version serves (a swap starts an
empty store). ``max_age_s`` = 0 keeps an answer only as long as the view it came from,
which is exact but rarely reused under ingestion: each batch publishes a view, and at
four batches a second most users are not asked twice within one (BENCHMARKS.md
"serve"). Ekko (OSDI'22) puts the bar for reflecting an event in others' answers at
a few seconds.

Concurrency: readers (``/recommend``) both read and add entries; single dict
operations are atomic under the interpreter lock and an entry is an immutable tuple,
so a reader sees either the old entry or the new one. The writer never touches a
store; it hands the next view the same store or a fresh one (``for_next_view``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import NamedTuple

import numpy as np

#: (item, score) pairs, best first.
Answer = tuple[tuple[str, float], ...]


class _Kept(NamedTuple):
    rated: Collection[str]
    vector: np.ndarray | None
    made_at: float
    answer: Answer


class KeptAnswers:
    """Up to ``limit`` answers by (user, k), cleared whole when full.

    Parameters
    ----------
    limit
        Most answers kept (0: none).
    max_age_s
        How long an answer may outlive the view it was computed from (0: not at all).
    clock
        Seconds on a monotonic scale (tests pass their own).
    """

    def __init__(
        self, limit: int, max_age_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.max_age_s = max_age_s
        self._clock = clock
        self._kept: dict[tuple[str, int], _Kept] = {}

    def get(
        self, user_id: str, k: int, rated: Collection[str], vector: np.ndarray | None
    ) -> Answer | None:
        """The kept answer if the user's ``rated`` items and online ``vector`` are the
        objects it came from and it is young enough, else None."""
        kept = self._kept.get((user_id, k))
        if kept is None or kept.rated is not rated or kept.vector is not vector:
            return None
        if self.max_age_s and self._clock() - kept.made_at > self.max_age_s:
            return None
        return kept.answer

    def put(
        self,
        user_id: str,
        k: int,
        rated: Collection[str],
        vector: np.ndarray | None,
        answer: Answer,
    ) -> None:
        """Keep ``answer``; only for rated items that are a frozenset, whose identity
        says they have not changed."""
        if not self.limit or not isinstance(rated, frozenset):
            return
        if len(self._kept) >= self.limit:
            self._kept.clear()
        made_at = self._clock() if self.max_age_s else 0.0
        self._kept[user_id, k] = _Kept(rated, vector, made_at, answer)

    def for_next_view(self) -> KeptAnswers:
        """What the view the writer publishes next keeps: this store while answers may
        outlive their view, else an empty one."""
        return self if self.max_age_s else self.emptied()

    def emptied(self) -> KeptAnswers:
        """An empty store with the same rules (a swap, a new index)."""
        return KeptAnswers(self.limit, self.max_age_s, self._clock)

    def __contains__(self, key: object) -> bool:
        return key in self._kept

    def __len__(self) -> int:
        return len(self._kept)
