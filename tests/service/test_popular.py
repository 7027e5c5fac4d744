"""Popular items kept in memory rank as the event store's query over the same window."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from service.serving.popular import PopularItems
from service.store import Database
from service.store.events import NewEvent, popular_items, store_events


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.mark.parametrize("window", [1, 7, 50, 400])
def test_in_memory_counts_match_the_stores_window_batch_after_batch(
    db: Database, window: int
) -> None:
    rng = random.Random(window)
    popular = PopularItems(window)
    for batch in range(12):
        events = [
            NewEvent(f"u{rng.randint(0, 30)}", f"i{int(rng.paretovariate(1.2)) % 40}", None)
            for _ in range(rng.randint(1, 60))
        ]
        with db.begin() as conn:
            store_events(conn, events)
            expected = popular_items(conn, window, limit=10_000)
        popular.add([e.user_id for e in events], [e.item_id for e in events])
        assert list(popular.ranking) == expected, f"batch {batch}"


def test_top_leaves_out_the_users_items_and_scores_by_share_of_the_window() -> None:
    popular = PopularItems(window=10)
    popular.add(["a", "b", "c", "a", "b"], ["x", "x", "x", "y", "z"])
    assert popular.top(2) == [("x", 3 / 5), ("y", 1 / 5)]
    assert popular.top(5, exclude={"x", "z"}) == [("y", 1 / 5)]
    assert PopularItems(window=3).top(10) == []


def test_the_published_ranking_is_bounded() -> None:
    popular = PopularItems(window=1000, ranked=3)
    popular.add([f"u{i}" for i in range(10)], [f"i{i}" for i in range(10)])
    assert [item for item, _ in popular.ranking] == ["i0", "i1", "i2"]


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        PopularItems(0)
