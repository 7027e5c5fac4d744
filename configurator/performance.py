"""The analytic epoch model: what an epoch of a config vector takes, costs and achieves.

What is arithmetic is derived, not learnt (CE-scaling §III-B's time and cost model,
adapted to selective sync), in parts with one job each:

* :mod:`configurator.slowdowns`: the workers' slowdown distribution (stragglers and
  jitter), warm and cold workers' mixture, and the κ-th-of-λ order statistic an epoch's
  latency is;
* :mod:`configurator.epoch_model`: :class:`EpochModel`, an epoch's latency (that order
  statistic of the workers' durations, plus the coordinator's seconds), its cost
  (Lambda's bill of all λ workers) and its progress, per candidate;
* :mod:`configurator.progress`: the loss-progress curve and its fit;
* :mod:`configurator.recalibration`: :func:`recalibrate`, the model refitted after every
  epoch to that epoch's λ invocation records. What it still gets wrong is the residual
  GPs' job (:mod:`configurator.surrogate`).

This module is where the rest of the product reaches the model.

References
----------
SandPiper (Ali et al.), §IV-B, Eq. 3; CE-scaling, §III-B, Eq. 2-4; S.
Venkataraman et al., "Ernest: efficient performance prediction for large-scale advanced
analytics", NSDI 2016 (how far an analytic scaling model goes).
"""

from __future__ import annotations

from configurator.epoch_model import (
    SAMPLE_BYTES,
    EpochModel,
    Predecessor,
    Prediction,
    latency_groups,
)
from configurator.epoch_model import _distinct as _distinct
from configurator.progress import PRIOR_KNEE, ProgressCurve, epoch_progress
from configurator.recalibration import recalibrate
from configurator.slowdowns import Z90

__all__ = [
    "PRIOR_KNEE",
    "SAMPLE_BYTES",
    "Z90",
    "EpochModel",
    "Predecessor",
    "Prediction",
    "ProgressCurve",
    "epoch_progress",
    "latency_groups",
    "recalibrate",
]
