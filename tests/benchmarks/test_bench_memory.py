"""``driftline bench memory``'s per-key figures: measured, and of the size the arrays imply."""

from __future__ import annotations

from benchmarks.bench.memory import online_state_bytes


def test_online_state_per_user_and_item_is_measured_and_plausible() -> None:
    figures = online_state_bytes(keys=2**12)
    dim = figures["factors"] + 2
    # A user's rows alone: a (k+2)² Gram matrix and three (k+2) vectors of float64.
    rows = 8 * (dim * dim + 3 * dim)
    assert rows < figures["foldin_bytes_per_user"] < 4 * rows
    # An item's rows: two float64 sums, plus its key in the recency index.
    assert 16 < figures["foldin_bytes_per_item"] < 1_000
    assert 0 < figures["history_bytes_per_user"] < 2_000
    # An item's code: an entry in the codes' dictionary and 8 bytes in two tables'
    # arrays, which grow by doubling.
    assert 16 < figures["item_codes_bytes_per_item"] < 500
