"""Which model version the registry says serves, and when each one served.

Three kinds of change make a version serving: publishing it (the newest version
serves), promoting it (with the rollout guard, a version published while another served
serves only from its promotion, ``service.rollout.guard``; in shadow or held it is no
change at all) and rolling back to it (an earlier version serves until the next publish,
promotion or rollback). All are rows in the database, so every process sharing it
derives the same timeline: a replica's registry follower serves the version the leader's
guard promoted or the admin rolled back to, and a restarted service resumes it, without
any state kept in memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServingChange:
    """From ``at`` (Unix seconds) on, ``version`` serves; ``trigger``: publish | promote |
    rollback."""

    at: float
    version: str
    trigger: str


@dataclass(frozen=True)
class ServingInterval:
    """``version`` served from ``started_at`` until ``ended_at`` (None: still serves)."""

    version: str
    started_at: float
    ended_at: float | None
    trigger: str


def changes(
    versions: Iterable[Mapping[str, Any]],
    rollbacks: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]] = (),
) -> list[ServingChange]:
    """Publishes, promotions and rollbacks as one list, oldest first (a tie puts the
    publish or promotion first). A version with a rollout row is a change only once
    promoted, at its promotion."""
    guarded = {row["version"]: row for row in rollouts}
    served = []
    for v in versions:
        rollout = guarded.get(v["version"])
        if rollout is None:
            served.append(ServingChange(float(v["created_at"]), v["version"], "publish"))
        elif rollout.get("promoted_at") is not None:
            served.append(ServingChange(float(rollout["promoted_at"]), v["version"], "promote"))
    rolled = [
        ServingChange(float(r["rolled_back_at"]), r["to_version"], "rollback") for r in rollbacks
    ]
    return sorted(served + rolled, key=lambda c: (c.at, c.trigger == "rollback"))


def target(
    versions: Iterable[Mapping[str, Any]],
    rollbacks: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]] = (),
) -> ServingChange | None:
    """The newest change whose version still has its artifact: what should serve now.

    Examples
    --------
    >>> rows = [{"version": "v1", "created_at": 1}, {"version": "v2", "created_at": 2}]
    >>> target(rows, [{"rolled_back_at": 3, "to_version": "v1"}])
    ServingChange(at=3.0, version='v1', trigger='rollback')
    >>> rows.append({"version": "v3", "created_at": 4})
    >>> target(rows, [{"rolled_back_at": 3, "to_version": "v1"}])
    ServingChange(at=4.0, version='v3', trigger='publish')
    >>> rows.append({"version": "v4", "created_at": 5})  # in shadow: not served yet
    >>> target(rows, [], [{"version": "v4", "promoted_at": None}])
    ServingChange(at=4.0, version='v3', trigger='publish')
    >>> target(rows, [], [{"version": "v4", "promoted_at": 6}])
    ServingChange(at=6.0, version='v4', trigger='promote')
    """
    rows = list(versions)
    kept = {row["version"] for row in rows if row.get("deleted_at") is None}
    live = [change for change in changes(rows, rollbacks, rollouts) if change.version in kept]
    return live[-1] if live else None


def intervals(
    versions: Iterable[Mapping[str, Any]],
    rollbacks: Iterable[Mapping[str, Any]],
    rollouts: Iterable[Mapping[str, Any]] = (),
) -> list[ServingInterval]:
    """When each version served, oldest first; each change ends the one before it.

    Examples
    --------
    >>> rows = [{"version": "v1", "created_at": 1}, {"version": "v2", "created_at": 2}]
    >>> [(i.version, i.started_at, i.ended_at) for i in
    ...  intervals(rows, [{"rolled_back_at": 3, "to_version": "v1"}])]
    [('v1', 1.0, 2.0), ('v2', 2.0, 3.0), ('v1', 3.0, None)]
    """
    timeline = changes(versions, rollbacks, rollouts)
    if not timeline:
        return []
    ends: list[float | None] = [change.at for change in timeline[1:]] + [None]
    return [
        ServingInterval(change.version, change.at, end, change.trigger)
        for change, end in zip(timeline, ends, strict=True)
    ]
