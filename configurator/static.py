"""A configurator that proposes the same config vector every epoch.

It is the baseline any searching configurator has to beat, and what a job uses when
nothing better is configured.
"""

from __future__ import annotations

from collections.abc import Sequence

from configurator.base import Configurator, Observation
from configurator.space import EpochConfig


class StaticConfigurator(Configurator):
    """Always proposes ``config``.

    Examples
    --------
    >>> cfg = EpochConfig(batch_size=256, learning_rate=0.05)
    >>> StaticConfigurator(cfg).propose(epoch=3, history=[]) == cfg
    True
    """

    def __init__(self, config: EpochConfig) -> None:
        self.config = config

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        return self.config
