"""Drift detector classes by river's class name, for the monitors that wrap them.

A name is the compiled equivalent where there is one (Page-Hinkley, the default:
``drift.page_hinkley.PageHinkley``), else river's own class in ``river.drift``.
``river.drift`` is imported on first use, not with this module: it imports river's
data sets and with them scikit-learn and scipy.stats, a large part of every process
start, which the default detector does not need.
"""

from __future__ import annotations

import importlib

from river.base import DriftDetector as RiverDetector

from drift.page_hinkley import PageHinkley

__all__ = ["detector_class"]

#: river detectors replaced by an equivalent that takes an array at a time.
_COMPILED: dict[str, type[RiverDetector]] = {"PageHinkley": PageHinkley}


def detector_class(name: str) -> type[RiverDetector]:
    """The detector class ``name`` names; ``ValueError`` when river has none."""
    if name in _COMPILED:
        return _COMPILED[name]
    found = getattr(importlib.import_module("river.drift"), name, None)
    if not isinstance(found, type):
        raise ValueError(f"river.drift has no detector {name!r}")
    return found
