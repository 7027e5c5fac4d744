"""Each epoch's share of the job's deadline and budget.

A job has ``latency_cap_s`` (and perhaps ``budget_usd``) for at most ``max_epochs``
epochs. An epoch plans to meet what is left over the epochs left (a job may stop early,
so this errs on the safe side). An epoch on time under the chance constraint usually
saves time against its nominal share (``latency_cap_s / max_epochs``); a job ahead of its
schedule spends only ``slack_spend`` of what it saved, keeping the rest in reserve (for a
window that jumps, a run of stragglers), since spending all of it sets the next epochs at
the edge of a share that has grown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from configurator.base import JobContext, Observation


class Shares:
    """The deadline and budget shares of a job's epochs.

    Parameters
    ----------
    context
        The job: its deadline, budget and most epochs.
    slack_spend
        Share of the time earlier epochs saved that an epoch may plan to spend.
    """

    def __init__(self, context: JobContext, slack_spend: float) -> None:
        self.context = context
        self.slack_spend = slack_spend

    def epochs_left(self, epoch: int) -> int:
        """Epochs the job has left, this one included (at least one: a job may overrun
        ``max_epochs``)."""
        return max(1, self.context.max_epochs - epoch)

    def of(self, epoch: int, history: Sequence[Observation]) -> tuple[float, float]:
        """``(seconds, dollars)``: this epoch's share of the time and money left, after
        the epochs of ``history``."""
        context = self.context
        left = self.epochs_left(epoch)
        elapsed = sum(o.duration_s for o in history)
        deadline = max(context.latency_cap_s - elapsed, 1e-3) / left
        nominal = context.latency_cap_s / context.max_epochs
        if deadline > nominal and self.slack_spend < 1:
            deadline = nominal + self.slack_spend * (deadline - nominal)
        spent = sum(o.cost_usd for o in history)
        budget = math.inf
        if context.budget_usd is not None:
            budget = max(context.budget_usd - spent, 1e-12) / left
        return deadline, budget


def share_after(deadline: float, left: int, log_latency: np.ndarray) -> np.ndarray:
    """Each later epoch's share of the time left once this epoch (``deadline``, one of
    ``left`` shares) took ``exp(log_latency)``; none when no epoch is left after it."""
    if left <= 1:
        return np.full(len(log_latency), 1e-12)
    return np.maximum((deadline * left - np.exp(log_latency)) / (left - 1), 1e-12)
