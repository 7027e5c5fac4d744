"""Configurators by name, chosen by ``RETRAIN_CONFIGURATOR``.

Each entry builds a configurator from the job's default config vector (the settings'
batch size, learning rate, workers, sync ratio and memory): the static configurator
proposes it every epoch; a searching one starts from it.
"""

from __future__ import annotations

from collections.abc import Callable

from configurator.base import Configurator
from configurator.space import EpochConfig
from configurator.static import StaticConfigurator

CONFIGURATORS: dict[str, Callable[[EpochConfig], Configurator]] = {
    "static": StaticConfigurator,
}


def make_configurator(name: str, default: EpochConfig) -> Configurator:
    """The configurator registered as ``name``, starting from ``default``."""
    try:
        build = CONFIGURATORS[name]
    except KeyError:
        choices = sorted(CONFIGURATORS)
        raise ValueError(f"unknown configurator {name!r}; choose from {choices}") from None
    return build(default)
