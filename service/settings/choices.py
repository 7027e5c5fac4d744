"""Settings whose value must name an entry of a registry (detectors, policies, ...)."""

from __future__ import annotations

from collections.abc import Iterable


def check_registered(field: str, value: str) -> str:
    """``value`` if it names an entry of ``field``'s registry; else a ValueError naming
    the choices.

    The registries are imported here, not at module import, so that reading settings
    stays cheap.
    """
    choices = sorted(_registry(field))
    if value not in choices:
        raise ValueError(f"unknown {field} {value!r}; choose from {choices}")
    return value


def _registry(field: str) -> Iterable[str]:
    """The names a registry-backed setting may take."""
    from configurator import CONFIGURATORS
    from drift import DETECTORS
    from retrain.policies import POLICIES
    from retrain.sync import SYNC_POLICIES

    registries: dict[str, Iterable[str]] = {
        "retrain_policy": POLICIES,
        "retrain_configurator": CONFIGURATORS,
        "retrain_sync": SYNC_POLICIES,
        "drift_detector": DETECTORS,
    }
    return registries[field]
