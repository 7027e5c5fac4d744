"""The batched popular-items window ranks as the per-event one did.

``PopularItems`` counts a batch's arriving and leaving pairs in one compiled pass over
integer codes and re-ranks once per batch; these tests replay seeded streams (skewed
users and items, repeated pairs, ids never seen before, batches longer than the window,
ids whose order as strings is easy to get wrong) through it and through the per-event
logic written out below, and ask for the same ranking, scores and saved window.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterator

import numpy as np
import pytest

from service.serving.popular import PopularItems


class _ReferencePopular:
    """``PopularItems`` as first written: each event moves a dict of pair counts and a
    sorted list of (-distinct users, item)."""

    def __init__(self, window: int, ranked: int) -> None:
        self.window, self.ranked = window, ranked
        self.events: deque[tuple[str, str]] = deque()
        self.pairs: dict[tuple[str, str], int] = {}
        self.users: dict[str, int] = {}
        self.order: list[tuple[int, str]] = []

    def add(self, user_ids: list[str], item_ids: list[str]) -> None:
        for pair in zip(user_ids, item_ids, strict=True):
            self.events.append(pair)
            self.pairs[pair] = self.pairs.get(pair, 0) + 1
            if self.pairs[pair] == 1:
                self._move(pair[1], +1)
        while len(self.events) > self.window:
            pair = self.events.popleft()
            self.pairs[pair] -= 1
            if not self.pairs[pair]:
                del self.pairs[pair]
                self._move(pair[1], -1)

    def _move(self, item: str, by: int) -> None:
        old = self.users.get(item, 0)
        new = self.users[item] = old + by
        if old:
            del self.order[bisect_left(self.order, (-old, item))]
        if new:
            insort(self.order, (-new, item))

    def ranking(self) -> tuple[tuple[str, int], ...]:
        return tuple((item, -negative) for negative, item in self.order[: self.ranked])

    def top(self, k: int, exclude: set[str]) -> list[tuple[str, float]]:
        chosen = [(item, count) for item, count in self.ranking() if item not in exclude][:k]
        return [(item, count / len(self.pairs)) for item, count in chosen]


#: Ids whose order as strings differs from their order as numbers, with prefixes,
#: case and characters outside ASCII and outside the basic plane.
_AWKWARD = ["", "a", "ab", "a0", "B", "b", "ä", "z", "10", "9", "09", "1 0", "é", "ü", "Z9", "𝔷"]


def _stream(seed: int, n: int, fresh: float) -> tuple[list[str], list[str]]:
    """Zipf users and items; a ``fresh`` share of items never seen before."""
    rng = np.random.default_rng(seed)
    users = [f"u{k}" for k in rng.zipf(1.3, n) % 80]
    items = [f"new{k}" if rng.random() < fresh else f"i{rng.zipf(1.2) % 300}" for k in range(n)]
    for at in rng.choice(n, n // 10, replace=False).tolist():
        items[at] = _AWKWARD[at % len(_AWKWARD)]
    return users, items


def _batches(n: int, seed: int, largest: int) -> Iterator[slice]:
    rng = np.random.default_rng(seed)
    start = 0
    while start < n:
        stop = min(n, start + int(rng.integers(0, largest + 1)))
        yield slice(start, stop)
        start = stop


@pytest.mark.parametrize(
    ("window", "ranked", "fresh"),
    [
        (1, 10, 0.0),
        (3, 5, 0.5),
        (7, 4, 0.3),
        (50, 2_000, 0.05),
        (400, 25, 0.2),
        (5_000, 2_000, 0.02),
    ],
)
def test_the_batched_window_ranks_as_the_per_event_one(
    window: int, ranked: int, fresh: float
) -> None:
    n = 12_000
    users, items = _stream(window, n, fresh)
    popular, reference = PopularItems(window, ranked), _ReferencePopular(window, ranked)
    rng = np.random.default_rng(window + 1)
    for number, part in enumerate(_batches(n, window, min(3 * window + 2, 900))):
        popular.add(users[part], items[part])
        reference.add(users[part], items[part])
        assert popular.ranking == reference.ranking(), f"batch {number}"
        assert popular.pairs == len(reference.pairs)
        if reference.pairs:
            exclude = set(rng.choice(_AWKWARD + [f"i{k}" for k in range(20)], 6).tolist())
            k = int(rng.integers(1, ranked + 2))
            got, expected = popular.top(k, exclude), reference.top(k, exclude)
            assert [item for item, _ in got] == [item for item, _ in expected]
            np.testing.assert_allclose([s for _, s in got], [s for _, s in expected], rtol=1e-12)
        state = popular.export_state()
        assert state["popular_users"].tolist() == [user for user, _ in reference.events]
        assert state["popular_items"].tolist() == [item for _, item in reference.events]


@pytest.mark.parametrize("window", [1, 6, 300])
def test_a_saved_window_loads_into_the_same_ranking(window: int) -> None:
    users, items = _stream(window + 7, 3_000, 0.3)
    popular = PopularItems(window, ranked=50)
    for part in _batches(len(users), 3, 200):
        popular.add(users[part], items[part])
    state = popular.export_state()
    again = PopularItems.from_state(state, window, ranked=50)
    assert again.ranking == popular.ranking and again.pairs == popular.pairs
    other = PopularItems(window, ranked=50)
    other.add(["x", "y"], ["only", "only"])
    other.load_state(state)
    assert other.ranking == popular.ranking
    for saved, loaded in zip(state.values(), other.export_state().values(), strict=True):
        assert saved.tolist() == loaded.tolist()
    # The loaded window carries on as the original does.
    more_users, more_items = _stream(window + 8, 500, 0.5)
    popular.add(more_users, more_items)
    other.add(more_users, more_items)
    assert other.ranking == popular.ranking


def test_a_window_of_new_ids_only_keeps_its_codes_bounded() -> None:
    popular, reference = PopularItems(window=5, ranked=3), _ReferencePopular(5, 3)
    for start in range(0, 4_000, 9):
        batch = [f"id{k}" for k in range(start, start + 9)]
        popular.add(batch, batch[::-1])
        reference.add(batch, batch[::-1])
        assert popular.ranking == reference.ranking()
    assert len(popular._window.items.names) <= 2 * 5 + 64
    assert len(popular._window.users.names) <= 2 * 5 + 64


def test_ids_with_nul_characters_rank_as_python_orders_them() -> None:
    """An id that only adds NULs to another sorts after it, as Python orders strings
    (NumPy's fixed-width strings would drop the NULs)."""
    users, items = _stream(3, 4_000, 0.2)
    nul = ["a\x00", "\x00", "a\x00b", "a", "\x00\x00", "b\x00"]
    items = [
        nul[at % len(nul)] if at % 7 == 0 and at > 2_000 else item for at, item in enumerate(items)
    ]
    popular, reference = PopularItems(300, 60), _ReferencePopular(300, 60)
    for part in _batches(len(users), 4, 150):
        popular.add(users[part], items[part])
        reference.add(users[part], items[part])
        assert popular.ranking == reference.ranking()
