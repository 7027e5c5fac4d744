"""A sudden drift with later onsets turns a further, different share of users at each."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.streams import GeneratorConfig, StreamGenerator
from benchmarks.streams.drifts import Sudden

EVENTS = 60_000


def _draw(**options: object) -> tuple[dict[str, np.ndarray], dict]:
    config = GeneratorConfig(
        events=EVENTS, seed=4, drift="sudden", drift_at=0.25, drift_options=dict(options)
    )
    generator = StreamGenerator(config)
    chunks = list(generator)
    columns = {n: np.concatenate([getattr(c, n) for c in chunks]) for n in ("users", "drifted")}
    return columns, generator.truth.to_dict()


def test_each_later_onset_turns_a_further_share_and_the_first_stays_as_it_was() -> None:
    once, truth_once = _draw()
    twice, truth_twice = _draw(then=(40_000,))
    first, second = EVENTS // 4, 40_000
    # Up to the second onset the stream is the single drift's, to the event.
    assert np.array_equal(once["drifted"][:second], twice["drifted"][:second])
    assert not twice["drifted"][:first].any() and truth_twice["onset"] == first
    assert "then" not in truth_once["parameters"]
    assert truth_twice["parameters"]["then"] == (40_000,)
    after = np.unique(twice["users"][second:])
    turned_once = set(np.unique(once["users"][second:][once["drifted"][second:]]).tolist())
    turned_twice = set(np.unique(twice["users"][second:][twice["drifted"][second:]]).tolist())
    assert turned_once < turned_twice  # the first band still turned, a new band added
    assert 0.2 < len(turned_once) / after.size < 0.4
    assert 0.45 < len(turned_twice) / after.size < 0.75
    assert truth_twice["description"].endswith("a further 30 % at event 40,000")


def test_later_onsets_must_come_after_and_leave_users_to_turn() -> None:
    with pytest.raises(ValueError, match="ascending"):
        Sudden(100, then=(50,))
    with pytest.raises(ValueError, match="exceed every user"):
        Sudden(100, share=0.4, then=(200, 300))
