"""Planted drifts act on the model from their onset on, only where they say, and the
ground truth beside the stream says exactly what they changed."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.streams import DRIFTS, GeneratorConfig, StreamGenerator

EVENTS = 60_000


def _draw(drift: str | None, **options: float) -> tuple[dict[str, np.ndarray], dict]:
    config = GeneratorConfig(
        events=EVENTS, seed=9, drift=drift, drift_at=0.5, drift_options=dict(options)
    )
    generator = StreamGenerator(config)
    chunks = list(generator)
    columns = {
        name: np.concatenate([getattr(c, name) for c in chunks])
        for name in ("users", "items", "ratings", "drifted")
    }
    return columns, generator.truth.to_dict()


@pytest.fixture(scope="module")
def plain() -> dict[str, np.ndarray]:
    return _draw(None)[0]


def _inverted(ratings: np.ndarray) -> np.ndarray:
    """Inversion on each rating's own scale: 5.5 - r in half stars, 6 - r in whole."""
    return np.where(ratings % 1 == 0.5, 5.5 - ratings, 6.0 - ratings)


def test_the_registry_holds_the_four_drifts_of_the_issue() -> None:
    assert set(DRIFTS) == {"sudden", "gradual", "item_shift", "new_cohort"}


def test_sudden_inverts_the_drifted_users_ratings_from_the_onset_and_nothing_else(
    plain: dict[str, np.ndarray],
) -> None:
    drifted, truth = _draw("sudden")
    changed = drifted["drifted"]
    onset = EVENTS // 2
    assert truth["onset"] == onset and not changed[:onset].any()
    assert np.array_equal(drifted["users"], plain["users"])  # the same stream otherwise
    assert np.array_equal(drifted["ratings"][~changed], plain["ratings"][~changed])
    whole = plain["ratings"][changed] % 1 == 0  # a whole-star user's scale is 1 to 5 ...
    expected = _inverted(plain["ratings"][changed])
    expected[whole & (plain["ratings"][changed] == 5.0)] = 1.0
    assert set(np.unique(drifted["ratings"][changed])) <= {x / 2 for x in range(1, 11)}
    turned = {f"u{u}" for u in np.unique(drifted["users"][changed])}
    after = {f"u{u}" for u in np.unique(drifted["users"][onset:])}
    assert turned == set(truth["drifted_users"])
    assert 0.2 < len(turned) / len(after) < 0.4  # 30 % of the users
    assert truth["drifted_events"] == int(changed.sum())
    # Every event of a turned user after the onset is inverted.
    users_after = drifted["users"][onset:]
    assert changed[onset:][np.isin(users_after, [int(u[1:]) for u in turned])].all()


def test_a_turned_rating_is_the_plain_one_inverted_on_its_users_scale(
    plain: dict[str, np.ndarray],
) -> None:
    drifted, _ = _draw("sudden")
    changed = drifted["drifted"]
    before, after = plain["ratings"][changed], drifted["ratings"][changed]
    half_star = (before % 1 == 0.5) | (after % 1 == 0.5) | (before == 0.5) | (after == 0.5)
    assert np.array_equal(after[half_star], 5.5 - before[half_star])
    whole = ~half_star
    assert np.all((after[whole] == 6.0 - before[whole]) | (after[whole] == 5.5 - before[whole]))


def test_gradual_ramps_in(plain: dict[str, np.ndarray]) -> None:
    drifted, truth = _draw("gradual", ramp=20_000)
    changed = drifted["drifted"]
    onset = EVENTS // 2
    early = changed[onset : onset + 5_000].mean()
    late = changed[onset + 20_000 :].mean()
    assert not changed[:onset].any() and 0 < early < late / 3
    assert truth["parameters"]["ramp"] == 20_000


def test_item_shift_lowers_the_shifted_items_ratings_only(plain: dict[str, np.ndarray]) -> None:
    drifted, truth = _draw("item_shift")
    changed = drifted["drifted"]
    assert not changed[: EVENTS // 2].any() and changed.any()
    assert np.array_equal(drifted["ratings"][~changed], plain["ratings"][~changed])
    assert (drifted["ratings"][changed] <= plain["ratings"][changed]).all()
    drop = (plain["ratings"][changed] - drifted["ratings"][changed]).mean()
    assert 0.8 < drop < 1.6  # 1.5 stars on the latent scale, less at the bottom of the scale
    shifted = {f"i{i}" for i in np.unique(drifted["items"][changed])}
    assert shifted == set(truth["drifted_items"])


def test_a_new_cohort_takes_over_a_share_of_the_stream_with_users_never_seen_before(
    plain: dict[str, np.ndarray],
) -> None:
    drifted, truth = _draw("new_cohort")
    changed, onset = drifted["drifted"], truth["onset"]
    assert onset >= EVENTS // 2 and not changed[:onset].any()
    assert np.array_equal(drifted["ratings"][: EVENTS // 2], plain["ratings"][: EVENTS // 2])
    cohort = np.unique(drifted["users"][changed])
    assert cohort.min() > drifted["users"][:onset].max()  # all joined at or after the onset
    assert 0.15 < changed[onset:].mean() < 0.45
