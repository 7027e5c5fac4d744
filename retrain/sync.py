"""How many of an epoch's λ workers the coordinator waits for: BSP, selective, ASP.

Synchronisation policies join through ``SYNC_POLICIES`` by name (``RETRAIN_SYNC``), each
built from the configured sync ratio κ/λ.

* ``bsp``: wait for all λ (fully synchronous), the baseline of distributed SGD;
* ``selective``: wait for the first ⌈κ/λ · λ⌉, fold the stragglers in later (SandPiper);
* ``asp``: apply every update on arrival (asynchronous), the other baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SyncPolicy:
    """How many of an epoch's λ workers the coordinator waits for.

    Examples
    --------
    >>> SyncPolicy.bsp().kappa(8), SyncPolicy.selective(0.5).kappa(8), SyncPolicy.asp().kappa(8)
    (8, 4, 1)
    """

    name: str
    ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in _KAPPA:
            raise ValueError(f"unknown sync policy {self.name!r}; choose bsp, selective or asp")
        if not 0 < self.ratio <= 1:
            raise ValueError(f"sync ratio must be in (0, 1], got {self.ratio}")

    @classmethod
    def bsp(cls) -> SyncPolicy:
        return cls("bsp", 1.0)

    @classmethod
    def selective(cls, ratio: float) -> SyncPolicy:
        return cls("selective", ratio)

    @classmethod
    def asp(cls) -> SyncPolicy:
        return cls("asp", 1.0)

    @property
    def applies_on_arrival(self) -> bool:
        """ASP: each update is applied alone as it arrives and its worker relaunched."""
        return self.name == "asp"

    @property
    def restarts_busy_shards(self) -> bool:
        """Selective: every shard starts on the new snapshot, a straggler's included."""
        return self.name == "selective"

    def kappa(self, workers: int, ratio: float | None = None) -> int:
        """κ: the updates of this epoch an epoch waits for; ``ratio`` is the epoch's
        own κ/λ (the configurator's pick), in place of the policy's, where it takes one."""
        return _KAPPA[self.name](self.ratio if ratio is None else ratio, workers)


#: κ of each policy, given the sync ratio and λ.
_KAPPA: dict[str, Callable[[float, int], int]] = {
    "bsp": lambda ratio, workers: workers,
    "selective": lambda ratio, workers: max(1, math.ceil(ratio * workers)),
    "asp": lambda ratio, workers: 1,
}


SYNC_POLICIES: dict[str, Callable[[float], SyncPolicy]] = {
    "bsp": lambda ratio: SyncPolicy.bsp(),
    "selective": SyncPolicy.selective,
    "asp": lambda ratio: SyncPolicy.asp(),
}


def sync_policy(name: str, ratio: float) -> SyncPolicy:
    """The policy registered as ``name``, with sync ratio ``ratio`` where it takes one."""
    try:
        build = SYNC_POLICIES[name]
    except KeyError:
        choices = sorted(SYNC_POLICIES)
        raise ValueError(f"unknown sync policy {name!r}; choose from {choices}") from None
    return build(ratio)
