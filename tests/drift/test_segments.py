"""Where an alert's rise comes from: ``drift.segments``.

Each stream is built by hand with one segment planted to carry the whole rise (its
squared errors jump at the change, everyone else's stay put), so the attribution can be
checked against the truth.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from drift.segments import SegmentBuffer, SegmentRules

CHANGE = 3_000
EVENTS = 5_000
LOW, HIGH = 0.6, 2.4


def _stream(seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """100 users drawn evenly, 200 items drawn by a Zipf-like popularity."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 100, EVENTS)
    weights = 1.0 / np.arange(1, 201)
    items = rng.choice(200, size=EVENTS, p=weights / weights.sum())
    return [f"u{u}" for u in users], [f"i{i}" for i in items], rng.gamma(2.0, LOW / 2.0, EVENTS)


def _report(users: list[str], items: list[str], errors: np.ndarray, **rules: int) -> dict:
    buffer = SegmentBuffer(capacity=10_000, rules=SegmentRules(**rules))
    buffer.record(users, items, errors, after=0)
    report = buffer.report(CHANGE)
    assert report is not None
    return report


def _shares(report: dict, side: str) -> dict[str, float]:
    return {name: seg["share_of_rise"] for name, seg in report[side].items()}


def test_returning_users_whose_taste_moved_carry_the_rise() -> None:
    users, items, errors = _stream()
    moved = {f"u{k}" for k in range(10)}
    after = np.arange(EVENTS) >= CHANGE
    hit = after & np.array([u in moved for u in users])
    report = _report(users, items, np.where(hit, HIGH, errors))

    assert report["events_before"] == CHANGE and report["events_after"] == EVENTS - CHANGE
    assert report["mse_rise"] > 0
    assert _shares(report, "users")["returning"] == pytest.approx(1.0)
    assert report["users"]["new"]["events_after"] == 0
    assert {entry["id"] for entry in report["top_users"]} == moved
    assert all(entry["baseline"] == "own" for entry in report["top_users"])


def test_a_cohort_of_newcomers_carries_the_rise() -> None:
    users, items, errors = _stream(1)
    after = np.flatnonzero(np.arange(EVENTS) >= CHANGE)
    cohort = after[::4]  # a quarter of the events after the change come from newcomers
    for rank, index in enumerate(cohort):
        users[index] = f"new{rank % 15}"
    errors = errors.copy()
    errors[cohort] = HIGH
    report = _report(users, items, errors)

    shares = _shares(report, "users")
    assert shares["new"] > 0.9 and shares["new"] + shares["returning"] == pytest.approx(1.0)
    new = report["users"]["new"]
    assert new["events_before"] == 0 and new["rmse_before"] is None
    assert new["events_after"] == cohort.size
    assert {entry["id"] for entry in report["top_users"]} <= {f"new{k}" for k in range(15)}
    assert report["top_users"][0]["baseline"] == "overall"


def test_a_rise_among_tail_items_is_the_tails() -> None:
    users, items, errors = _stream(2)
    counts: dict[str, int] = {}
    for item in items[:CHANGE]:
        counts[item] = counts.get(item, 0) + 1
    niche = {item for item, n in counts.items() if n < 15}
    hit = (np.arange(EVENTS) >= CHANGE) & np.array([i in niche for i in items])
    report = _report(users, items, np.where(hit, HIGH, errors))

    shares = _shares(report, "items")
    assert shares["tail"] > 0.95
    assert shares["head"] + shares["tail"] == pytest.approx(1.0)
    assert {entry["id"] for entry in report["top_items"]} <= niche


def test_the_head_draws_about_the_head_share_of_events() -> None:
    users, items, errors = _stream(3)
    report = _report(users, items, np.where(np.arange(EVENTS) >= CHANGE, HIGH, errors))
    head, tail = report["items"]["head"], report["items"]["tail"]
    compared = report["events_before"] + report["events_after"]
    head_events = head["events_before"] + head["events_after"]
    assert 0.2 <= head_events / compared < 0.3  # ties at the boundary join the head
    assert head_events + tail["events_before"] + tail["events_after"] == compared
    assert report["head_min_popularity"] > 0


def test_a_mix_shift_towards_a_worse_segment_is_counted_to_it() -> None:
    """Nobody gets worse, but after the change the hard users rate twice as often."""
    rng = np.random.default_rng(4)
    hard = rng.random(EVENTS) < np.where(np.arange(EVENTS) >= CHANGE, 0.6, 0.3)
    users = [f"hard{k % 5}" if h else f"easy{k % 50}" for k, h in enumerate(hard)]
    errors = np.where(hard, HIGH, LOW)
    report = _report(users, ["i0"] * EVENTS, errors)
    assert report["mse_rise"] == pytest.approx(0.3 * (HIGH - LOW), abs=0.05)
    assert report["users"]["returning"]["share_of_rise"] == pytest.approx(1.0)
    moved = {entry["id"] for entry in report["top_users"] if abs(entry["mse_rise"]) > 1e-9}
    assert moved == set()  # each user's own level is unchanged


def test_one_unlucky_event_does_not_top_the_list() -> None:
    users, items, errors = _stream(5)
    users[CHANGE + 10], errors[CHANGE + 10] = "once", 50.0
    report = _report(users, items, errors, min_events=3)
    assert "once" not in {entry["id"] for entry in report["top_users"]}
    assert all(entry["events_after"] >= 3 for entry in report["top_users"])
    assert len(report["top_users"]) == 10 and len(report["top_items"]) == 10


def test_shares_are_none_when_the_error_did_not_rise() -> None:
    users, items, errors = _stream(6)
    lower = np.where(np.arange(EVENTS) >= CHANGE, errors / 2, errors)
    report = _report(users, items, lower)
    assert report["mse_rise"] < 0
    assert report["users"]["returning"]["share_of_rise"] is None


def test_the_reference_before_the_change_is_bounded() -> None:
    users, items, errors = _stream(7)
    report = _report(users, items, errors, reference_events=1_000)
    assert report["events_before"] == 1_000
    assert report["rules"]["reference_events"] == 1_000


def test_a_report_is_plain_json() -> None:
    users, items, errors = _stream(8)
    report = _report(users, items, np.where(np.arange(EVENTS) >= CHANGE, HIGH, errors))
    assert json.loads(json.dumps(report, allow_nan=False)) == report


@pytest.mark.parametrize("change", [0, EVENTS, EVENTS + 7])
def test_no_report_without_events_on_both_sides(change: int) -> None:
    users, items, errors = _stream(9)
    buffer = SegmentBuffer(capacity=EVENTS)
    buffer.record(users, items, errors, after=0)
    assert buffer.report(change) is None


def test_the_buffer_keeps_the_newest_events_in_order_and_counts_popularity_among_them() -> None:
    buffer = SegmentBuffer(capacity=4)
    buffer.record(["a", "b", "c"], ["x", "x", "y"], [1.0, 1.0, 1.0], after=10)
    buffer.record(["d", "e", "f"], ["x", "x", "x"], [4.0, 4.0, 4.0], after=13)
    positions, users, items, _errors, popularity = buffer._ordered()
    assert len(buffer) == 4
    assert positions.tolist() == [13, 14, 15, 16]
    assert users.tolist() == ["c", "d", "e", "f"]
    # d found a and b's "x" (the buffer had room); e and f each pushed out an "x" first.
    assert popularity.tolist() == [0, 2, 2, 2]
    assert buffer._item_counts == {"y": 1, "x": 3}


def test_a_batch_larger_than_the_buffer_keeps_its_tail() -> None:
    buffer = SegmentBuffer(capacity=3)
    buffer.record([f"u{k}" for k in range(8)], ["i"] * 8, np.arange(8.0), after=0)
    positions, users, *_ = buffer._ordered()
    assert positions.tolist() == [6, 7, 8]
    assert users.tolist() == ["u5", "u6", "u7"]
    assert sum(buffer._item_counts.values()) == 3


@pytest.mark.parametrize(
    "rules",
    [
        {"head_share": 0.0},
        {"head_share": 1.0},
        {"min_events": 0},
        {"new_user_events": 0},
        {"reference_events": True},
        {"top": -1},
    ],
)
def test_bad_rules_are_refused(rules: dict) -> None:
    with pytest.raises(ValueError):
        SegmentRules(**rules)


def test_misaligned_columns_are_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        SegmentBuffer().record(["a"], ["x", "y"], [1.0], after=0)
