"""``LruRows`` against a plain least-recently-seen reference on random key streams:
the same keys kept, the same keys evicted in the same order, the same rows reused."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from service.serving.rows import LruRows


class ReferenceLru:
    """Least recently seen order kept by moving every sighted key to the end."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.order: OrderedDict[str, None] = OrderedDict()

    def see(self, keys: list[str]) -> None:
        for key in keys:
            self.order[key] = None
            self.order.move_to_end(key)

    def evict(self) -> list[str]:
        evicted = []
        while len(self.order) > self.limit:
            key, _ = self.order.popitem(last=False)
            evicted.append(key)
        return evicted


@pytest.mark.parametrize("seed", range(6))
def test_rows_keep_and_evict_exactly_the_least_recently_seen_keys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    limit = int(rng.integers(5, 300))
    rows, reference = LruRows({"total": ()}, limit=limit), ReferenceLru(limit)
    universe = int(rng.integers(limit + 1, 6 * limit))
    for _ in range(200):
        size = int(rng.integers(1, 3 * limit))
        # Zipf-like: some keys come back often, most rarely; repeats within a batch.
        drawn = np.minimum(rng.zipf(1.3, size), universe) - 1
        keys = [f"k{int(k)}" for k in drawn]
        got = rows.rows_for(keys)
        reference.see(keys)
        assert [rows.key_of(int(r)) for r in got] == keys  # each key its own row
        assert rows.evict() == reference.evict()
        assert rows.by_recency() == list(reference.order)
    assert len(rows) == len(reference.order) <= limit


def test_a_loaded_copy_evicts_as_the_original_would() -> None:
    rng = np.random.default_rng(11)
    rows = LruRows({"total": (2,)}, limit=50)
    for _ in range(30):
        rows.rows_for([f"k{int(k)}" for k in rng.integers(0, 120, 40)])
        rows.evict()
    copy = LruRows({"total": (2,)}, limit=50)
    copy.load_state(rows.export_state("x_"), "x_")
    for _ in range(30):
        keys = [f"k{int(k)}" for k in rng.integers(0, 200, 40)]
        assert copy.rows_for(keys).tolist() == rows.rows_for(keys).tolist()
        assert copy.evict() == rows.evict()
