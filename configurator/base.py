"""What every configurator offers the retraining coordinator."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from configurator.space import EpochConfig


@dataclass(frozen=True)
class Observation:
    """How one epoch went under a config: the data a configurator learns from."""

    config: EpochConfig
    duration_s: float
    loss: float
    cost_usd: float = 0.0


class Configurator(ABC):
    """Picks the config vector of the next epoch from the epochs observed so far."""

    @abstractmethod
    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        """The config for epoch ``epoch`` (0-based) given ``history``."""
