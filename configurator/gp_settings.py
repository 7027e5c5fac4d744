"""How GP-OPT decides: its settings, checked once.

Why ``min_improvement`` and ``slack_spend`` are sized as they are:
``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from configurator.surrogate import SURROGATES


@dataclass(frozen=True)
class GpOptSettings:
    """How GP-OPT decides.

    Parameters
    ----------
    confidence
        Probability with which the epoch must meet its deadline share (and budget).
    explore_slack
        Explore only candidates whose cost per progress, at the 90th percentile of its
        posterior, is at most this much above the incumbent's mean (0.25: 25 % dearer).
    switch_gain
        Least predicted relative gain for which memory or λ change.
    keep
        Most candidates left after pruning (scored by the GPs).
    use_gp, calibrate
        Switch off the residual GPs, or the analytic model's recalibration: the
        benchmark's ``analytic_calibrated`` and ``analytic`` baselines.
    surrogate
        A name in ``SURROGATES``.
    background
        Refit hyper-parameters on a thread (the service); False refits in line after the
        decision (reproducible: benchmarks and tests).
    refit_growth
        Refit when the distinct observations have grown by this factor since the last
        refit.
    min_improvement
        Least expected improvement (a share of the incumbent's cost per progress,
        feasibility-weighted) for which an epoch explores; below it the epoch runs the
        incumbent, as CherryPick (NSDI'17) stops searching once EI falls under 10 %.
    slack_spend
        Share of the time earlier epochs saved against their nominal share
        (``LATENCY_CAP_SECONDS / max_epochs``) that an epoch may plan to spend; a job
        behind its schedule plans at its share of what is left whatever this is. An
        epoch on time under the chance constraint usually saves time, and spending all
        of it sets the next epochs at the edge of a share that has grown: under a 0.9
        constraint about one in ten of them runs late, though the job as a whole meets
        its deadline. Less than 1 keeps the rest in reserve (for a window that jumps, a
        run of stragglers) at some cost in regret.
    """

    confidence: float = 0.9
    explore_slack: float = 0.25
    switch_gain: float = 0.03
    keep: int = 2000
    use_gp: bool = True
    calibrate: bool = True
    surrogate: str = "gpytorch"
    background: bool = True
    refit_growth: float = 1.5
    min_improvement: float = 0.1
    slack_spend: float = 0.4

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.explore_slack < 0 or self.switch_gain < 0:
            raise ValueError("explore_slack and switch_gain must not be negative")
        if self.keep < 1:
            raise ValueError(f"keep must be at least 1, got {self.keep}")
        if not 0 <= self.min_improvement < 1:
            raise ValueError(f"min_improvement must be in [0, 1), got {self.min_improvement}")
        if not 0 <= self.slack_spend <= 1:
            raise ValueError(f"slack_spend must be in [0, 1], got {self.slack_spend}")
        if self.refit_growth <= 1:
            raise ValueError(f"refit_growth must exceed 1, got {self.refit_growth}")
        if self.surrogate not in SURROGATES:
            raise ValueError(
                f"unknown surrogate {self.surrogate!r}; choose from {sorted(SURROGATES)}"
            )
