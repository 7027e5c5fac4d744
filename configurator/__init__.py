"""Choosing each retraining epoch's configuration (SandPiper Algorithm 1)."""

from configurator.base import Configurator, Decision, JobContext, Observation, WorkerRun
from configurator.history import History
from configurator.registry import CONFIGURATORS, make_configurator
from configurator.space import EpochConfig, SearchSpace
from configurator.static import StaticConfigurator

__all__ = [
    "CONFIGURATORS",
    "Configurator",
    "Decision",
    "EpochConfig",
    "History",
    "JobContext",
    "Observation",
    "SearchSpace",
    "StaticConfigurator",
    "WorkerRun",
    "make_configurator",
]
