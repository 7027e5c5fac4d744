"""Choosing each retraining epoch's configuration (SandPiper Algorithm 1)."""

from configurator.base import Configurator, Observation
from configurator.space import EpochConfig
from configurator.static import StaticConfigurator

__all__ = ["Configurator", "EpochConfig", "Observation", "StaticConfigurator"]
