"""Conformance checks every drift detector passes (one parametrised suite).

Every entry of ``drift.DETECTORS`` joins the suite as the service builds it.
"""

import json
import pickle

import numpy as np
import pytest

import drift
from drift.base import DriftDetector
from drift.heartbeat import Heartbeat
from drift.monitor import DriftMonitor

DETECTORS = [
    DriftMonitor(),
    DriftMonitor(delta=0.05, min_relative_drop=0.0, min_heartbeats=2),
    *(
        drift.make_detector(name, delta=0.002, min_relative_drop=0.1, min_heartbeats=5)
        for name in drift.DETECTORS
    ),
]
#: Stable test ids (an object's default repr holds its address, which differs between
#: the processes of a parallel run).
DETECTOR_IDS = ["heartbeat-default", "heartbeat-eager", *drift.DETECTORS]


def heartbeats(seed: int = 0) -> list[Heartbeat]:
    rng = np.random.default_rng(seed)
    values = np.r_[rng.normal(0.9, 0.05, 150), rng.normal(1.3, 0.05, 80), rng.normal(1.0, 0.05, 80)]
    return [Heartbeat(i, 100, 100 * (i + 1), float(v)) for i, v in enumerate(values)]


def run(detector: DriftDetector, beats: list[Heartbeat]) -> list[object]:
    return [detector.update(beat) for beat in beats]


@pytest.mark.parametrize("detector", DETECTORS, ids=DETECTOR_IDS)
def test_clone_reproduces_the_same_outputs(detector: DriftDetector) -> None:
    beats = heartbeats()
    first, second = detector.clone(), detector.clone()
    assert first.get_params() == detector.get_params()
    outputs = run(first, beats)
    assert outputs == run(second, beats)
    assert any(out is not None for out in outputs)


@pytest.mark.parametrize("detector", DETECTORS, ids=DETECTOR_IDS)
def test_state_round_trips_through_pickle(detector: DriftDetector) -> None:
    beats = heartbeats(seed=1)
    original = detector.clone()
    run(original, beats[:170])
    restored = pickle.loads(pickle.dumps(original))
    assert run(restored, beats[170:]) == run(original, beats[170:])


@pytest.mark.parametrize("detector", DETECTORS, ids=DETECTOR_IDS)
def test_reset_behaves_like_a_fresh_clone(detector: DriftDetector) -> None:
    beats = heartbeats(seed=2)
    used = detector.clone()
    run(used, beats)
    used.reset()
    assert run(used, beats) == run(detector.clone(), beats)


@pytest.mark.parametrize("detector", DETECTORS, ids=DETECTOR_IDS)
def test_state_resumes_through_json_at_every_point(detector: DriftDetector) -> None:
    beats = heartbeats(seed=3)
    expected = run(detector.clone(), beats)
    for stop in (0, 60, 160, 175, 240):
        before = detector.clone()
        run(before, beats[:stop])
        resumed = detector.clone()
        resumed.restore(json.loads(json.dumps(before.state())))
        assert run(resumed, beats[stop:]) == expected[stop:], stop


def test_an_unknown_detector_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="adwin-heartbeat"):
        drift.make_detector("no-such-detector", delta=0.1, min_relative_drop=0.1, min_heartbeats=5)
