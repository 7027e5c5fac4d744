"""Drift detection: prequential evaluation, heartbeats and the ADWIN monitor.

The serving model's errors flow through ``PrequentialTracker`` (running accuracy per
predictor), ``HeartbeatAggregator`` (errors grouped into an RMSE series) and
``DriftMonitor`` (ADWIN with a minimum-drop confirmation), which emits ``DriftAlert``.
This package knows nothing about HTTP, SQL or how a retrain is run.
"""

from drift.base import DriftDetector
from drift.detectors import DETECTORS, make_detector
from drift.heartbeat import Heartbeat, HeartbeatAggregator
from drift.monitor import DriftAlert, DriftMonitor
from drift.prequential import PrequentialTracker, squared_errors

__all__ = [
    "DETECTORS",
    "DriftAlert",
    "DriftDetector",
    "DriftMonitor",
    "Heartbeat",
    "HeartbeatAggregator",
    "PrequentialTracker",
    "make_detector",
    "squared_errors",
]
