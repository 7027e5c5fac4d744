import re

import numpy as np
import pytest

from tests.support.synthetic import ItemMeanBaseline, planted_drift_stream, stationary_stream


def ratings(events: list[dict]) -> np.ndarray:
    return np.array([e["rating"] for e in events])


def rmse(model: ItemMeanBaseline, events: list[dict]) -> float:
    return float(np.sqrt(np.mean((ratings(events) - model.predict(events)) ** 2)))


def test_same_seed_gives_the_same_stream_and_another_seed_does_not() -> None:
    assert planted_drift_stream(seed=3) == planted_drift_stream(seed=3)
    assert planted_drift_stream(seed=3) != planted_drift_stream(seed=4)
    assert stationary_stream(seed=3) == stationary_stream(seed=3)


def test_events_are_in_strictly_increasing_timestamp_order() -> None:
    stamps = [e["timestamp"] for e in planted_drift_stream()]
    assert all(isinstance(t, float) for t in stamps)
    assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))


def test_fields_ids_and_ratings_have_the_documented_form() -> None:
    events = planted_drift_stream(n_users=20, n_items=30, n_events=500, drift_at=250)
    assert len(events) == 500
    assert len({e["event_id"] for e in events}) == 500
    for event in events:
        assert set(event) == {"event_id", "user_id", "item_id", "rating", "timestamp"}
        assert re.fullmatch(r"u\d+", event["user_id"]) and int(event["user_id"][1:]) < 20
        assert re.fullmatch(r"i\d+", event["item_id"]) and int(event["item_id"][1:]) < 30
        assert 0.5 <= event["rating"] <= 5.0
        assert (event["rating"] * 2).is_integer()
    assert abs(ratings(events).mean() - 3.5) < 0.3


def test_a_user_rates_an_item_at_most_once_when_pairs_suffice() -> None:
    events = planted_drift_stream()
    pairs = {(e["user_id"], e["item_id"]) for e in events}
    assert len(pairs) == len(events)


def test_more_events_than_pairs_still_works() -> None:
    events = stationary_stream(n_users=3, n_items=4, n_events=50)
    assert len(events) == 50


def test_streams_agree_until_the_drift_point() -> None:
    drifting = planted_drift_stream(drift_at=10_000)
    stationary = stationary_stream()
    assert drifting[:10_000] == stationary[:10_000]
    assert ratings(drifting[10_000:]).tolist() != ratings(stationary[10_000:]).tolist()


def test_planted_drift_makes_a_model_fit_before_it_much_worse_after_it() -> None:
    events = planted_drift_stream(drift_at=10_000)
    model = ItemMeanBaseline().fit(events[:5_000])
    before, after = rmse(model, events[5_000:10_000]), rmse(model, events[10_000:])
    assert after >= 1.3 * before


def test_stationary_stream_keeps_the_same_error_level() -> None:
    events = stationary_stream()
    model = ItemMeanBaseline().fit(events[:5_000])
    before, after = rmse(model, events[5_000:10_000]), rmse(model, events[10_000:])
    assert after == pytest.approx(before, rel=0.05)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_users": 0}, "n_users"),
        ({"n_events": 0}, "n_events"),
        ({"drift_at": 30_000}, "drift_at"),
        ({"drift_at": -1}, "drift_at"),
        ({"noise": -0.1}, "noise"),
    ],
)
def test_invalid_arguments_are_rejected_by_name(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        planted_drift_stream(**kwargs)
