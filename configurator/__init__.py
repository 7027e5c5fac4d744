"""Choosing each retraining epoch's configuration (SandPiper Algorithm 1)."""

from configurator.base import Configurator, Observation
from configurator.registry import CONFIGURATORS, make_configurator
from configurator.space import EpochConfig
from configurator.static import StaticConfigurator

__all__ = [
    "CONFIGURATORS",
    "Configurator",
    "EpochConfig",
    "Observation",
    "StaticConfigurator",
    "make_configurator",
]
