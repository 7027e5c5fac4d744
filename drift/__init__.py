"""Drift detection: prequential evaluation, heartbeats and the drift detectors.

The serving model's errors flow through ``PrequentialTracker`` (running accuracy per
predictor), ``RankingTracker`` (running hit-rate@10 and NDCG@10 on a fixed sample of
liked events), ``HeartbeatAggregator`` (errors grouped into heartbeats that carry the
RMSE and the single errors) and a detector of ``DETECTORS`` (``EventDriftMonitor``
on every event by default, ``DriftMonitor`` on the heartbeat series as the baseline),
each confirming a change by its size before it emits a ``DriftAlert``.
This package knows nothing about HTTP, SQL or how a retrain is run.
"""

from drift.base import DriftDetector
from drift.detectors import DETECTORS, make_detector
from drift.event_monitor import EventDriftMonitor
from drift.heartbeat import Heartbeat, HeartbeatAggregator, UserKeys, user_key
from drift.monitor import DriftAlert, DriftMonitor
from drift.prequential import PrequentialTracker, squared_errors
from drift.ranking import RankingSampler, RankingTracker, hits, ndcg, rank_of, ranks_of

__all__ = [
    "DETECTORS",
    "DriftAlert",
    "DriftDetector",
    "DriftMonitor",
    "EventDriftMonitor",
    "Heartbeat",
    "HeartbeatAggregator",
    "PrequentialTracker",
    "RankingSampler",
    "RankingTracker",
    "UserKeys",
    "hits",
    "make_detector",
    "ndcg",
    "rank_of",
    "ranks_of",
    "squared_errors",
    "user_key",
]
