"""The in-memory history of rated items: what it holds, its bound, its snapshots."""

from __future__ import annotations

import pytest

from service.serving.history import RatedItems


def test_a_user_holds_every_item_once() -> None:
    history = RatedItems()
    history.add(["a", "b", "a"], ["i1", "i1", "i2"])
    history.add(["a"], ["i1"])
    assert history.items("a") == {"i1", "i2"} and history.items("b") == {"i1"}
    assert history.pairs == 3 and len(history) == 2
    assert history.items("nobody") == frozenset() and "nobody" not in history


def test_the_bound_evicts_the_least_recently_seen_users_first() -> None:
    history = RatedItems(max_pairs=4)
    history.add(["a", "a", "b"], ["i1", "i2", "i1"])
    history.add(["c"], ["i3"])  # 4 pairs: at the bound
    history.add(["a"], ["i9"])  # a is the most recent now; b is the oldest
    assert history.users() == ["c", "a"]
    assert history.pairs == 4 and "b" not in history
    history.add(["d", "e"], ["i1", "i2"])
    assert history.pairs <= 4 and history.users()[-2:] == ["d", "e"]


def test_a_batch_over_the_bound_keeps_its_newest_users() -> None:
    history = RatedItems(max_pairs=2)
    history.add(["a", "b", "c"], ["i1", "i2", "i3"])
    assert history.users() == ["b", "c"] and history.pairs == 2


def test_a_single_user_over_the_bound_keeps_the_newest_items() -> None:
    history = RatedItems(max_pairs=3)
    history.add(["a"] * 5, ["i1", "i2", "i3", "i4", "i5"])
    assert history.items("a") == {"i3", "i4", "i5"} and history.pairs == 3


def test_a_snapshot_taken_before_a_batch_never_changes() -> None:
    history = RatedItems(max_pairs=2)
    history.add(["a"], ["i1"])
    before = history.snapshot
    items_of_a = history.items("a")
    history.add(["a", "b", "c"], ["i2", "i3", "i4"])
    assert dict(before) == {"a": frozenset({"i1"})}
    assert items_of_a == {"i1"}
    assert history.items("a") == frozenset()  # evicted since: the reader was unaffected


def test_a_bound_below_one_or_mismatched_columns_are_refused() -> None:
    with pytest.raises(ValueError, match="max_pairs"):
        RatedItems(max_pairs=0)
    with pytest.raises(ValueError, match="users"):
        RatedItems().add(["a"], [])
