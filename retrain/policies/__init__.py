"""Trigger policies: when the service starts a retraining job.

Policies join through ``POLICIES`` by name (``RETRAIN_POLICY``), so the service never
branches on a policy's type; ``make_policy`` builds one from the knobs it takes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from retrain.policies.adwin import AdwinPolicy
from retrain.policies.base import TriggerPolicy
from retrain.policies.best_effort import BestEffortPolicy
from retrain.policies.continuum import ContinuumPolicy, fit_training_time
from retrain.policies.cost_aware import CostAwarePolicy
from retrain.policies.never import NeverPolicy
from retrain.policies.periodic import PeriodicPolicy

#: Trigger policies by name (``RETRAIN_POLICY``).
POLICIES: dict[str, Callable[..., TriggerPolicy]] = {
    "adwin": AdwinPolicy,
    "best-effort": BestEffortPolicy,
    "cost-aware": CostAwarePolicy,
    "continuum": ContinuumPolicy,
    "periodic": PeriodicPolicy,
    "never": NeverPolicy,
}


def make_policy(name: str, **knobs: Any) -> TriggerPolicy:
    """The policy ``name`` built with those of ``knobs`` its constructor takes.

    The service passes every policy setting; each policy keeps its own (the
    interval for ``cost-aware``, w for ``continuum``), so adding a policy with a new
    knob never changes the others.

    >>> make_policy("periodic", bootstrap_events=5, every_events=7, interval_s=60)
    PeriodicPolicy(bootstrap_events=5, every_events=7, name='periodic')
    """
    factory = POLICIES[name]
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return factory(**knobs)
    return factory(**{k: v for k, v in knobs.items() if k in params})


__all__ = [
    "POLICIES",
    "AdwinPolicy",
    "BestEffortPolicy",
    "ContinuumPolicy",
    "CostAwarePolicy",
    "NeverPolicy",
    "PeriodicPolicy",
    "TriggerPolicy",
    "fit_training_time",
    "make_policy",
]
