"""When a retraining job stops (``docs/architecture.md``, "Retraining")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class StopReason(StrEnum):
    CONVERGED = "converged"
    MAX_EPOCHS = "max_epochs"
    LATENCY_CAP = "latency_cap"
    BUDGET = "budget"
    #: A drift alert pre-empted the job (``Retrainer.preempt``): it stopped after the
    #: epoch in flight and published nothing.
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class ConvergenceRule:
    """Stop when the training loss has settled, or when time or money runs out.

    With a ``target_loss`` the job has converged once the loss stayed below it for
    ``patience`` consecutive epochs (SandPiper's rule). Without one, "settled" means the
    loss improved by less than ``min_improvement`` (relative) in each of the last
    ``patience`` epochs: a fixed target cannot suit every data window, a plateau can.

    Examples
    --------
    >>> rule = ConvergenceRule(target_loss=0.5, patience=2, max_epochs=10)
    >>> rule.check([0.9, 0.45], elapsed_s=1.0) is None
    True
    >>> rule.check([0.9, 0.45, 0.44], elapsed_s=1.0)
    <StopReason.CONVERGED: 'converged'>
    """

    target_loss: float | None = None
    patience: int = 5
    min_improvement: float = 0.005
    max_epochs: int = 30
    latency_cap_s: float = 600.0
    budget_usd: float | None = None

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"patience must be at least 1, got {self.patience}")
        if self.max_epochs < 1:
            raise ValueError(f"max_epochs must be at least 1, got {self.max_epochs}")
        if not self.latency_cap_s > 0:
            raise ValueError(f"latency_cap_s must be positive, got {self.latency_cap_s}")

    def check(
        self, losses: Sequence[float], elapsed_s: float, cost_usd: float = 0.0
    ) -> StopReason | None:
        """The reason to stop after the epochs whose losses are ``losses``, or None."""
        if self._settled(losses):
            return StopReason.CONVERGED
        if len(losses) >= self.max_epochs:
            return StopReason.MAX_EPOCHS
        if elapsed_s >= self.latency_cap_s:
            return StopReason.LATENCY_CAP
        if self.budget_usd is not None and cost_usd >= self.budget_usd:
            return StopReason.BUDGET
        return None

    def _settled(self, losses: Sequence[float]) -> bool:
        if self.target_loss is not None:
            recent = losses[-self.patience :]
            return len(recent) == self.patience and all(x < self.target_loss for x in recent)
        if len(losses) <= self.patience:
            return False
        window = losses[-self.patience - 1 :]
        steps = zip(window[:-1], window[1:], strict=True)
        return all((prev - cur) <= self.min_improvement * prev for prev, cur in steps)
