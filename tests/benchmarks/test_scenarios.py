"""Planted drifts change what they say, from where they say, and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.scenarios import SCENARIOS, plant, synthetic_stream


@pytest.fixture(scope="module")
def base():
    return synthetic_stream(n_users=300, n_items=200, n_events=8_000, seed=5)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_nothing_changes_before_the_onset(base, name: str) -> None:
    planted = plant(name, base, at=0.5)
    cut = len(base) // 2
    assert planted.stream.user_ids[:cut] == base.user_ids[:cut]
    assert planted.stream.item_ids == base.item_ids
    np.testing.assert_array_equal(planted.stream.ratings[:cut], base.ratings[:cut])
    assert not planted.drifted[:cut].any()
    assert ((planted.stream.ratings >= 0.5) & (planted.stream.ratings <= 5.0)).all()


def test_the_control_plants_nothing(base) -> None:
    planted = plant("control", base)
    assert planted.onset is None and not planted.drifted.any()
    np.testing.assert_array_equal(planted.stream.ratings, base.ratings)


def test_a_sudden_inversion_flips_a_third_of_the_users_from_the_onset(base) -> None:
    planted = plant("sudden", base, at=0.5)
    flipped = {u for u, d in zip(planted.stream.user_ids, planted.drifted, strict=True) if d}
    assert 0.25 < len(flipped) / len(set(base.user_ids)) <= 0.31
    changed = planted.drifted
    np.testing.assert_array_equal(planted.stream.ratings[changed], 5.5 - base.ratings[changed])


def test_a_gradual_drift_ramps_in(base) -> None:
    planted = plant("gradual", base, at=0.25)
    onset = len(base) // 4
    early = planted.drifted[onset : onset + 1_000].mean()
    late = planted.drifted[-1_000:].mean()
    assert early < late


def test_an_item_shift_lowers_the_chosen_items_by_one_and_a_half_stars(base) -> None:
    planted = plant("item_shift", base, at=0.5)
    changed = planted.drifted
    expected = np.clip(base.ratings[changed] - 1.5, 0.5, 5.0)
    np.testing.assert_array_equal(planted.stream.ratings[changed], expected)


def test_a_new_cohort_brings_users_never_seen_before(base) -> None:
    planted = plant("new_cohort", base, at=0.5)
    cohort = {u for u, d in zip(planted.stream.user_ids, planted.drifted, strict=True) if d}
    assert cohort and cohort.isdisjoint(base.user_ids)


def test_an_unknown_scenario_is_refused_naming_the_choices(base) -> None:
    with pytest.raises(ValueError, match="sudden"):
        plant("earthquake", base)


def test_an_inversion_stays_on_a_whole_star_scale() -> None:
    base = synthetic_stream(n_users=300, n_items=200, n_events=8_000, seed=5)
    whole = np.clip(np.round(base.ratings), 1.0, 5.0)
    stream = type(base)(base.user_ids, base.item_ids, whole, base.timestamps)
    planted = plant("sudden", stream, at=0.5)
    changed = planted.drifted
    np.testing.assert_array_equal(planted.stream.ratings[changed], 6.0 - whole[changed])
    shifted = plant("item_shift", stream, at=0.5).stream.ratings
    assert shifted.min() >= 1.0 and set(np.unique(shifted)) <= {
        1.0,
        1.5,
        2.0,
        2.5,
        3.0,
        3.5,
        4.0,
        4.5,
        5.0,
    }
