"""Drifts planted in the generating model, and the ground truth written beside a stream.

The drifts mirror ``benchmarks.scenarios`` (same names, same shares and sizes), but act on
the model rather than on a recorded stream: a drifted user's taste is inverted on the
user's own rating scale as the rating is drawn, a shifted item's latent score falls
before it is rated, and a new cohort is a burst of fresh users taking over active slots.
Users who join after the onset drift like those already there, so a detector sees a
change in the population, not in a fixed list of people.

Examples
--------
>>> drift = make_drift("sudden", onset=100)
>>> drift.name, drift.share, drift.describe()
('sudden', 0.3, '30 % of users invert their taste at event 100')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.streams.population import Catalogue, Users, item_id, user_id

__all__ = [
    "DRIFTS",
    "ChunkEvents",
    "Drift",
    "DriftEffect",
    "Gradual",
    "GroundTruth",
    "ItemShift",
    "NewCohort",
    "Sudden",
    "make_drift",
]


@dataclass(frozen=True)
class DriftEffect:
    """What a drift does to a chunk of ``n`` events: a shift of each latent score, which
    ratings to invert on their user's scale, and which events it changed."""

    latent_shift: np.ndarray | None
    invert: np.ndarray
    drifted: np.ndarray


@dataclass(frozen=True)
class ChunkEvents:
    """The events of a chunk as a drift sees them (``n`` each): global index, the user
    table and each event's row in it, item index, and whether a cohort slot made it;
    and how many latent units make a star."""

    index: np.ndarray
    users: Users
    rows: np.ndarray
    items: np.ndarray
    catalogue: Catalogue
    cohort: np.ndarray
    latent_per_star: float = 1.0


@dataclass(frozen=True)
class Drift:
    """A drift from event ``onset`` on; ``share`` of users (or items) are affected."""

    onset: int
    share: float = 0.3
    name: str = field(default="", init=False)
    #: Whose ids the ground truth lists: ``"users"`` or ``"items"``.
    affects: str = field(default="users", init=False)

    def __post_init__(self) -> None:
        if self.onset < 0:
            raise ValueError(f"onset must be >= 0, got {self.onset}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {self.share}")

    @property
    def cohort_share(self) -> float:
        """Share of active slots a new cohort takes over at the onset (0: none)."""
        return 0.0

    def effect(self, events: ChunkEvents, rng: np.random.Generator) -> DriftEffect:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def parameters(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k not in ("name", "affects")}


@dataclass(frozen=True)
class Sudden(Drift):
    """``share`` of users invert their taste at ``onset``, and a further ``share``, not
    yet turned, at each onset of ``then`` (events, ascending): the users whose per-user
    draw falls in ``[k · share, (k + 1) · share)`` turn at the k-th onset, so a stream
    with no ``then`` is the one it always was.

    >>> Sudden(100, then=(200,)).describe()
    '30 % of users invert their taste at event 100, a further 30 % at event 200'
    """

    then: tuple[int, ...] = ()
    name: str = field(default="sudden", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        then = tuple(int(onset) for onset in self.then)
        object.__setattr__(self, "then", then)
        if any(b <= a for a, b in zip((self.onset, *then), then, strict=False)):
            raise ValueError(f"then must be ascending onsets after {self.onset}, got {then}")
        if self.share * (1 + len(then)) > 1.0:
            raise ValueError(f"{1 + len(then)} onsets of {self.share:.0%} exceed every user")

    def effect(self, events: ChunkEvents, rng: np.random.Generator) -> DriftEffect:
        mark = events.users.mark[events.rows]
        drifted = (mark < self.share) & (events.index >= self.onset)
        for number, onset in enumerate(self.then, start=1):
            band = (mark >= number * self.share) & (mark < (number + 1) * self.share)
            drifted |= band & (events.index >= onset)
        return DriftEffect(None, drifted, drifted)

    def describe(self) -> str:
        further = "".join(f", a further {self.share:.0%} at event {o:,}" for o in self.then)
        return (
            f"{self.share:.0%} of users invert their taste at event {self.onset:,}{further}"
        ).replace("%", " %")

    def parameters(self) -> dict[str, Any]:
        out = super().parameters()
        if not self.then:
            del out["then"]  # a single onset's truth reads as it always did
        return out


@dataclass(frozen=True)
class Gradual(Drift):
    """The same users invert, each event with a chance ramping from 0 to 1 over
    ``ramp`` events after ``onset``."""

    ramp: int = 20_000
    name: str = field(default="gradual", init=False)

    def effect(self, events: ChunkEvents, rng: np.random.Generator) -> DriftEffect:
        turned = events.users.mark[events.rows] < self.share
        chance = np.clip((events.index - self.onset) / max(self.ramp, 1), 0.0, 1.0)
        drifted = turned & (rng.random(events.index.size) < chance)
        return DriftEffect(None, drifted, drifted)

    def describe(self) -> str:
        return (
            f"{self.share:.0%} of users invert their taste over {self.ramp:,} events "
            f"from event {self.onset:,}"
        ).replace("%", " %")


@dataclass(frozen=True)
class ItemShift(Drift):
    """``share`` of items are rated ``shift`` stars lower from ``onset`` on (the latent
    score falls by as much as ``shift`` stars span mid-scale; the scale's ends clip)."""

    share: float = 0.2
    shift: float = 1.5
    name: str = field(default="item_shift", init=False)
    affects: str = field(default="items", init=False)

    def effect(self, events: ChunkEvents, rng: np.random.Generator) -> DriftEffect:
        shifted = events.catalogue.mark[events.items] < self.share
        drifted = shifted & (events.index >= self.onset)
        shift = self.shift * events.latent_per_star
        return DriftEffect(-shift * drifted, np.zeros_like(drifted), drifted)

    def describe(self) -> str:
        return (
            f"{self.share:.0%} of items fall by {self.shift:g} stars at event {self.onset:,}"
        ).replace("%", " %")


@dataclass(frozen=True)
class NewCohort(Drift):
    """At ``onset`` fresh users take over ``share`` of the active slots, and users who
    later join those slots belong to the cohort too; the cohort's taste is inverted."""

    name: str = field(default="new_cohort", init=False)

    @property
    def cohort_share(self) -> float:
        return self.share

    def effect(self, events: ChunkEvents, rng: np.random.Generator) -> DriftEffect:
        return DriftEffect(None, events.cohort, events.cohort)

    def describe(self) -> str:
        return (
            f"new users with inverted taste make {self.share:.0%} of the events "
            f"from event {self.onset:,}"
        ).replace("%", " %")


DRIFTS: dict[str, Callable[..., Drift]] = {
    "sudden": Sudden,
    "gradual": Gradual,
    "item_shift": ItemShift,
    "new_cohort": NewCohort,
}


def make_drift(name: str, onset: int, **parameters: Any) -> Drift:
    """The drift ``name`` from ``DRIFTS`` starting at event ``onset``."""
    try:
        build = DRIFTS[name]
    except KeyError:
        raise ValueError(f"unknown drift {name!r}; choose from {', '.join(DRIFTS)}") from None
    return build(onset=onset, **parameters)


@dataclass
class GroundTruth:
    """What was planted where, accumulated as the stream is drawn.

    ``onset`` is the index of the first event drawn under the drift (for a new cohort,
    the first event of the round after the planned onset), ``onset_timestamp`` its
    arrival time; ``drifted`` holds the ids of the users (or items) whose events changed.
    """

    drift: Drift | None
    events: int = 0
    onset: int | None = None
    onset_timestamp: float | None = None
    drifted_events: int = 0
    first_drifted: int | None = None
    drifted: set[str] = field(default_factory=set)

    def observe(
        self,
        start: int,
        timestamps: np.ndarray,
        drifted: np.ndarray,
        users: np.ndarray,
        items: np.ndarray,
    ) -> None:
        """Take in a chunk of ``n`` events from ``start`` on: their arrival times, which
        the drift changed, and their users' serials and items' indices (``n`` each)."""
        n = timestamps.size
        if self.drift is not None and self.onset_timestamp is None:
            onset = max(self.drift.onset, start) if self.onset is None else self.onset
            if start <= onset < start + n:
                self.onset = onset
                self.onset_timestamp = float(timestamps[onset - start])
        hits = np.flatnonzero(drifted)
        if hits.size and self.drift is not None:
            if self.first_drifted is None:
                self.first_drifted = start + int(hits[0])
            self.drifted_events += int(hits.size)
            if self.drift.affects == "users":
                self.drifted.update(user_id(s) for s in np.unique(users[hits]).tolist())
            else:
                self.drifted.update(item_id(i) for i in np.unique(items[hits]).tolist())
        self.events += n

    def to_dict(self) -> dict[str, Any]:
        drift = self.drift
        return {
            "events": self.events,
            "drift": None if drift is None else drift.name,
            "description": None if drift is None else drift.describe(),
            "parameters": None if drift is None else drift.parameters(),
            "onset": self.onset,
            "onset_timestamp": self.onset_timestamp,
            "first_drifted_event": self.first_drifted,
            "drifted_events": self.drifted_events,
            f"drifted_{'users' if drift is None else drift.affects}": sorted(
                self.drifted, key=_id_order
            ),
        }


def _id_order(identifier: str) -> tuple[int, str]:
    digits = identifier.lstrip("abcdefghijklmnopqrstuvwxyz")
    return (int(digits) if digits.isdigit() else -1, identifier)
