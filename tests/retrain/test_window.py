"""Data windows of a retraining job: ``retrain.window``."""

from __future__ import annotations

import numpy as np
import pytest

from retrain.spec import JobSpec
from retrain.window import ChangeWindowPolicy, RatingsWindow, WindowPolicy


def _window(n: int, prefix: str = "") -> RatingsWindow:
    """``n`` events whose rating is their position, so every event is recognisable."""
    return RatingsWindow(
        [f"{prefix}u{k}" for k in range(n)],
        [f"{prefix}i{k}" for k in range(n)],
        np.arange(n, dtype=np.float64),
    )


# -- RatingsWindow -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("users", "items", "ratings"),
    [
        (["a", "b"], ["x"], [1.0, 2.0]),
        (["a"], ["x", "y"], [1.0]),
        (["a", "b"], ["x", "y"], [1.0]),
        ([], [], [1.0]),
    ],
)
def test_columns_of_different_lengths_are_rejected(
    users: list[str], items: list[str], ratings: list[float]
) -> None:
    with pytest.raises(ValueError, match="same length"):
        RatingsWindow(users, items, np.asarray(ratings))


def test_length_is_the_number_of_events() -> None:
    assert len(_window(7)) == 7
    assert len(RatingsWindow([], [], np.empty(0))) == 0


def test_take_keeps_the_masked_events_in_order() -> None:
    window = _window(5)
    taken = window.take(np.array([True, False, True, False, True]))
    assert taken.user_ids == ["u0", "u2", "u4"]
    assert taken.item_ids == ["i0", "i2", "i4"]
    assert taken.ratings.tolist() == [0.0, 2.0, 4.0]


# -- split_holdout -----------------------------------------------------------------


def test_holdout_is_every_tenth_event_by_default() -> None:
    train, holdout = _window(25).split_holdout()
    assert holdout.ratings.tolist() == [9.0, 19.0]
    assert holdout.user_ids == ["u9", "u19"]
    assert len(train) == 23
    assert train.ratings.tolist() == [k for k in range(25) if k not in (9, 19)]


@pytest.mark.parametrize(("n", "every"), [(9, 3), (10, 2), (100, 7), (101, 10)])
def test_holdout_stride_takes_the_last_event_of_each_stride(n: int, every: int) -> None:
    train, holdout = _window(n).split_holdout(every)
    expected = list(range(every - 1, n, every))
    assert holdout.ratings.astype(int).tolist() == expected
    assert len(holdout) == n // every
    # train and holdout partition the window, in order, with no event lost or repeated.
    assert sorted(train.ratings.tolist() + holdout.ratings.tolist()) == list(range(n))
    assert train.ratings.tolist() == sorted(train.ratings.tolist())
    assert train.user_ids == [f"u{int(r)}" for r in train.ratings]
    assert train.item_ids == [f"i{int(r)}" for r in train.ratings]


def test_a_window_shorter_than_the_stride_has_no_holdout() -> None:
    window = _window(9)
    train, holdout = window.split_holdout(10)
    assert train is window
    assert len(holdout) == 0
    assert holdout.user_ids == [] and holdout.item_ids == []


def test_a_window_as_long_as_the_stride_holds_out_its_last_event() -> None:
    train, holdout = _window(10).split_holdout(10)
    assert holdout.ratings.tolist() == [9.0]
    assert len(train) == 9


@pytest.mark.parametrize("every", [1, 0, -3])
def test_a_stride_below_two_holds_nothing_out(every: int) -> None:
    window = _window(20)
    train, holdout = window.split_holdout(every)
    assert train is window
    assert len(holdout) == 0


def test_an_empty_window_splits_into_two_empty_windows() -> None:
    train, holdout = RatingsWindow([], [], np.empty(0)).split_holdout()
    assert len(train) == 0 and len(holdout) == 0


def test_split_is_reproducible() -> None:
    window = _window(57)
    first, second = window.split_holdout(4), window.split_holdout(4)
    for a, b in zip(first, second, strict=True):
        assert a.user_ids == b.user_ids
        np.testing.assert_array_equal(a.ratings, b.ratings)


# -- WindowPolicy.build ------------------------------------------------------------


class FakeSource:
    """A ``WindowSource`` over two fixed lists: ``history`` (ids 1..h) and ``recent``.

    ``uniform_sample`` draws ``size`` by ``seed``, as the store does, and every call is
    recorded so a test can see what the policy asked for.
    """

    def __init__(self, history: RatingsWindow, recent: RatingsWindow) -> None:
        self.history = history
        self.recent = recent
        self.calls: list[tuple[str, int, int]] = []

    def since(self, after_id: int, up_to_id: int) -> RatingsWindow:
        self.calls.append(("since", after_id, up_to_id))
        return self.recent

    def uniform_sample(self, up_to_id: int, size: int, seed: int) -> RatingsWindow:
        self.calls.append(("uniform_sample", up_to_id, size))
        n = min(len(self.history), up_to_id)
        rows = np.random.default_rng(seed).choice(n, size=min(size, n), replace=False)
        mask = np.zeros(len(self.history), dtype=bool)
        mask[rows] = True
        return self.history.take(mask)


def test_a_first_window_is_the_recent_events_only() -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    window = WindowPolicy(history_sample=10).build(source, since_id=0, up_to_id=130)
    assert window is source.recent
    assert source.calls == [("since", 0, 130)]


def test_a_later_window_joins_a_history_sample_before_the_recent_events() -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    window = WindowPolicy(history_sample=10).build(source, since_id=100, up_to_id=130)
    assert ("since", 100, 130) in source.calls
    assert ("uniform_sample", 100, 10) in source.calls
    assert len(window) == 10 + 30
    assert all(u.startswith("old-") for u in window.user_ids[:10])
    assert window.user_ids[10:] == source.recent.user_ids
    assert window.item_ids[10:] == source.recent.item_ids
    np.testing.assert_array_equal(window.ratings[10:], source.recent.ratings)
    # The columns stay aligned across the join.
    assert [u.removeprefix("old-u") for u in window.user_ids[:10]] == [
        i.removeprefix("old-i") for i in window.item_ids[:10]
    ]


@pytest.mark.parametrize("sample", [1, 5, 40, 99])
def test_history_is_capped_by_the_sample_size(sample: int) -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    window = WindowPolicy(history_sample=sample).build(source, since_id=100, up_to_id=130)
    older = [u for u in window.user_ids if u.startswith("old-")]
    assert len(older) == sample
    assert len(window) == sample + 30


def test_a_window_holds_the_newest_events_at_most_and_samples_the_rest() -> None:
    source = FakeSource(_window(120, "old-"), _window(10, "new-"))
    window = WindowPolicy(history_sample=15, max_recent=10).build(source, 100, 130)
    # The 20 events after the version but before the newest 10 count as history.
    assert source.calls == [("since", 120, 130), ("uniform_sample", 120, 15)]
    assert len(window) == 15 + 10


def test_a_drift_window_also_holds_the_newest_events_at_most() -> None:
    source = FakeSource(_window(120, "old-"), _window(10, "new-"))
    policy = ChangeWindowPolicy(after_id=50, history_ratio=1.0, max_recent=10)
    policy.build(source, 0, 130)
    assert source.calls == [("since", 120, 130), ("uniform_sample", 120, 10)]


@pytest.mark.parametrize("bad", [0, -3])
def test_a_window_bound_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="max_recent"):
        WindowPolicy(max_recent=bad)
    with pytest.raises(ValueError, match="max_recent"):
        ChangeWindowPolicy(after_id=1, history_ratio=1.0, max_recent=bad)


def test_history_smaller_than_the_sample_size_joins_whole() -> None:
    source = FakeSource(_window(8, "old-"), _window(3, "new-"))
    window = WindowPolicy(history_sample=50).build(source, since_id=8, up_to_id=11)
    assert window.user_ids == source.history.user_ids + source.recent.user_ids


def test_an_empty_history_sample_leaves_the_recent_events() -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    window = WindowPolicy(history_sample=0).build(source, since_id=100, up_to_id=130)
    assert window.user_ids == source.recent.user_ids


def test_a_window_with_history_but_no_recent_events_is_the_history_sample() -> None:
    source = FakeSource(_window(100, "old-"), RatingsWindow([], [], np.empty(0)))
    window = WindowPolicy(history_sample=20).build(source, since_id=100, up_to_id=100)
    assert len(window) == 20
    assert all(u.startswith("old-") for u in window.user_ids)


def test_default_history_sample_is_fifty_thousand() -> None:
    assert WindowPolicy().history_sample == 50_000


# -- ChangeWindowPolicy.build ------------------------------------------------------


@pytest.mark.parametrize(("ratio", "older"), [(0.0, 0), (0.5, 15), (1.0, 30), (3.0, 90)])
def test_a_drift_window_is_every_recent_event_and_a_ratio_of_older_ones(
    ratio: float, older: int
) -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    window = ChangeWindowPolicy(after_id=100, history_ratio=ratio).build(source, 40, 130)
    assert ("since", 100, 130) in source.calls  # from the change, not from the version
    assert window.user_ids[len(window) - 30 :] == source.recent.user_ids
    sampled = window.user_ids[: len(window) - 30]
    assert len(sampled) == older and len(set(sampled)) == older
    assert all(u.startswith("old-") for u in sampled)


def test_the_older_sample_is_also_capped_by_the_history_sample() -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    policy = ChangeWindowPolicy(after_id=100, history_ratio=3.0, history_sample=20)
    assert len(policy.build(source, 0, 130)) == 20 + 30


def test_a_change_at_the_start_has_no_older_events() -> None:
    source = FakeSource(_window(100, "old-"), _window(30, "new-"))
    window = ChangeWindowPolicy(after_id=0, history_ratio=1.0).build(source, 0, 30)
    assert window is source.recent
    assert [c[0] for c in source.calls] == ["since"]


def test_the_older_sample_is_drawn_with_the_seed() -> None:
    def draw(seed: int) -> list[str]:
        source = FakeSource(_window(100, "old-"), _window(30, "new-"))
        policy = ChangeWindowPolicy(after_id=100, history_ratio=0.5, seed=seed)
        return policy.build(source, 0, 130).user_ids

    assert draw(1) == draw(1) != draw(2)


@pytest.mark.parametrize(
    "bad", [{"after_id": -1}, {"history_ratio": -0.5}, {"history_ratio": float("nan")}]
)
def test_a_bad_drift_window_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ChangeWindowPolicy(**{"after_id": 10, "history_ratio": 1.0, **bad})


def test_a_spec_builds_the_drift_window_only_for_a_drift_job_with_a_ratio() -> None:
    assert isinstance(JobSpec(drift_history_ratio=1.0).window_policy(), WindowPolicy)
    assert isinstance(JobSpec(change_after_id=5).window_policy(), WindowPolicy)
    policy = JobSpec(drift_history_ratio=2.0, change_after_id=5, seed=None).window_policy()
    assert policy == ChangeWindowPolicy(5, 2.0, 50_000, 0)
    spec = JobSpec(drift_history_ratio=2.0, change_after_id=5)
    assert JobSpec.from_params(spec.as_params()) == spec  # a resumed job rebuilds it
