"""The generated stream: reproducible, streaming, on MovieLens' scale, at the trace's rate,
with users who are never reused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from benchmarks.streams import GeneratorConfig, StreamGenerator, generate_stream, load_fit
from benchmarks.streams.population import FreshUsers
from benchmarks.streams.stats import compare, stream_statistics


def _columns(config: GeneratorConfig) -> tuple[np.ndarray, ...]:
    chunks = list(StreamGenerator(config))
    return tuple(
        np.concatenate([getattr(c, name) for c in chunks])
        for name in ("users", "items", "ratings", "timestamps")
    )


def test_a_seed_gives_one_stream_and_another_seed_another() -> None:
    first = _columns(GeneratorConfig(events=40_000, seed=3))
    again = _columns(GeneratorConfig(events=40_000, seed=3))
    other = _columns(GeneratorConfig(events=40_000, seed=4))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[2], other[2])


def test_a_short_stream_is_the_start_of_a_long_one() -> None:
    short = _columns(GeneratorConfig(events=5_000, seed=2))
    long = _columns(GeneratorConfig(events=90_000, seed=2))
    assert all(np.array_equal(s, l_[:5_000]) for s, l_ in zip(short, long, strict=True))


def test_ratings_are_on_the_half_star_scale_and_whole_star_users_keep_to_whole_stars() -> None:
    stream = generate_stream(GeneratorConfig(events=60_000, seed=5))
    assert set(np.unique(stream.ratings)) <= {x / 2 for x in range(1, 11)}
    halves: dict[str, bool] = {}
    for user, rating in zip(stream.user_ids, stream.ratings.tolist(), strict=True):
        halves[user] = halves.get(user, False) or rating % 1 == 0.5
    share = np.mean(list(halves.values()))
    assert 0.3 < share < 0.9  # some users rate in half stars, some never do


def test_users_are_drawn_fresh_and_each_spends_exactly_its_budget() -> None:
    """A user who left has made as many events as its budget, and never comes back:
    the same seed's fresh users are the budgets the stream spent."""
    fit = load_fit()
    config = GeneratorConfig(events=300_000, seed=6, active_users=8)
    generator = StreamGenerator(config)
    counts: Counter[int] = Counter()
    for chunk in generator:
        counts.update(chunk.users.tolist())
    # The last chunk is cut at the length asked for: its users may have had more to say.
    still_active = set(generator.active.users.serial.tolist()) | set(chunk.users.tolist())
    seeds = np.random.SeedSequence(config.seed).spawn(8)
    budgets = FreshUsers(fit, np.random.default_rng(seeds[1])).take(max(counts) + 1).budget
    left = [user for user in counts if user not in still_active]
    assert len(left) > 1_000  # far more users than are active at once
    assert all(counts[user] == budgets[user] for user in left)
    assert len(generator.active) == 8  # memory: the active users only, whatever the length


def test_arrivals_follow_the_trace_at_its_rate() -> None:
    stream = generate_stream(GeneratorConfig(events=50_000, seed=1, trace="constant", rate=500))
    stamps = stream.timestamps
    assert (np.diff(stamps) >= 0).all()
    assert (stamps[-1] - stamps[0]) == pytest.approx(100.0, rel=0.03)
    regular = generate_stream(
        GeneratorConfig(events=1_000, trace="berkeley", speed=10, poisson=False)
    )
    assert regular.timestamps[0] > 1.6e9 and (np.diff(regular.timestamps) > 0).all()


def test_the_committed_fit_reproduces_the_figures_it_recorded_of_movielens() -> None:
    """A stream of MovieLens' length from the shipped fit against the data set's own
    figures (kept in the fit, so this needs no copy of MovieLens)."""
    fit = load_fit()
    ours = stream_statistics(generate_stream(GeneratorConfig(events=fit.events, seed=0)))
    distance = compare(ours, fit.reference)
    assert distance["histogram_tv_distance"] < 0.05
    for key in ("popularity_gini", "activity_gini"):
        assert abs(distance[f"{key}_difference"]) < 0.05, distance
    assert abs(ours["rating_mean"] - fit.reference["rating_mean"]) < 0.1
    assert 0.7 < ours["activity"]["count"] / fit.reference["activity"]["count"] < 1.3


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"events": 0}, "events must be at least 1"),
        ({"trace": "nope"}, "unknown trace"),
        ({"drift": "nope"}, "unknown drift"),
        ({"drift_at": 1.5}, "drift_at"),
        ({"rate": 10.0, "trace": "wiki"}, "constant trace only"),
    ],
)
def test_the_config_refuses_what_cannot_be_generated(arguments: dict, message: str) -> None:
    with pytest.raises((ValueError, KeyError), match=message):
        GeneratorConfig(**{"events": 10, **arguments})
