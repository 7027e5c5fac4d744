"""Configurators by name, chosen by ``RETRAIN_CONFIGURATOR``.

Each entry builds a configurator from the job's default config vector (the settings'
batch size, learning rate, workers, sync ratio and memory), the job's context (window
size, deadline, budget; None where the caller has none) and the store of earlier jobs'
observations (None: no warm start): the static configurator proposes the default every
epoch; GP-OPT searches from the context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from configurator.base import Configurator, JobContext
from configurator.history import History
from configurator.space import EpochConfig
from configurator.static import StaticConfigurator

if TYPE_CHECKING:
    from configurator.process import ConfiguratorHost


def _static(
    default: EpochConfig, context: JobContext | None, history: History | None
) -> Configurator:
    return StaticConfigurator(default)


def _gp(default: EpochConfig, context: JobContext | None, history: History | None) -> Configurator:
    from configurator.gp import GpOptConfigurator

    return GpOptConfigurator(default, context, history=history)


CONFIGURATORS: dict[
    str, Callable[[EpochConfig, JobContext | None, History | None], Configurator]
] = {
    "static": _static,
    "gp": _gp,
}

#: Configurators whose decisions are numeric work (fits, posteriors over thousands of
#: candidates): given a host, they run in its process, off the serving process's
#: interpreter lock (``configurator.process``). The static one answers a constant.
ISOLATED: frozenset[str] = frozenset({"gp"})


def make_configurator(
    name: str,
    default: EpochConfig,
    context: JobContext | None = None,
    history: History | None = None,
    host: ConfiguratorHost | None = None,
) -> Configurator:
    """The configurator registered as ``name``, starting from ``default``; in ``host``'s
    process when it is given and ``name`` is one of :data:`ISOLATED`."""
    try:
        build = CONFIGURATORS[name]
    except KeyError:
        choices = sorted(CONFIGURATORS)
        raise ValueError(f"unknown configurator {name!r}; choose from {choices}") from None
    if host is not None and name in ISOLATED:
        return host.configurator(name, default, context, history)
    return build(default, context, history)
