"""The latency interval widened until it holds the job's own epochs (split-conformal).

The analytic order statistic is exact only for the slowdowns it assumes; until a job's
records show the fleet's tail (a job of one or two workers an epoch shows it slowly), its
intervals are too narrow, and a pick at the edge of the chance constraint runs late more
often than the constraint allows. Each decision records its 90 % latency interval; once a
few epochs ran, their standardised errors say how much wider it must be.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from configurator.base import Decision, Observation
from configurator.slowdowns import Z90

#: Epochs decided before the latency interval is widened by the job's own errors, and
#: how many recent ones it looks at.
CALIBRATION_EPOCHS = 5
CALIBRATION_WINDOW = 20
#: Epochs' worth of the model's own interval (a widening of 1) the job's errors are
#: pooled with. The 90th percentile of five errors is nearly their largest: alone, one
#: straggler among a job's first epochs would widen every later interval so far that
#: nothing looked likely on time and the job fell back to its fastest, dearest configs.
CALIBRATION_PRIOR_EPOCHS = 10
#: z of a two-sided 90 % interval (its upper end is the 95th percentile).
Z95 = 1.6448536269514722


def latency_widening(decisions: Sequence[Decision], history: Sequence[Observation]) -> float:
    """How much wider the latency posterior must be to hold this job's own epochs: the
    90th percentile of their standardised errors over the normal's, at least 1, once
    ``CALIBRATION_EPOCHS`` epochs were decided here, pooled with
    ``CALIBRATION_PRIOR_EPOCHS`` epochs' worth of the model's own percentile so that a
    few errors move it by little.

    ``decisions`` are the job's decisions so far, the last ``len(history)`` of them those
    of the epochs of ``history``.
    """
    # The decision of epoch t is the t-th of those made for this job's epochs.
    decided = decisions[-len(history) :] if history else []
    pairs = list(zip(decided, history[-len(decided) :], strict=True)) if decided else []
    errors = []
    for decision, observed in pairs[-CALIBRATION_WINDOW:]:
        sd = math.log(max(decision.latency_interval_s[1], 1e-12) / decision.latency_s) / Z95
        sd /= decision.extra.get("latency_widening", 1.0)  # the model's own spread
        if sd > 0 and observed.duration_s > 0:
            errors.append(math.log(observed.duration_s / decision.latency_s) / sd)
    if len(errors) < CALIBRATION_EPOCHS:
        return 1.0
    n, prior = len(errors), CALIBRATION_PRIOR_EPOCHS
    quantile = (n * float(np.quantile(errors, 0.9)) + prior * Z90) / (n + prior)
    return max(1.0, quantile / Z90)
