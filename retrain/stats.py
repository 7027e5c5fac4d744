"""What a distributed job's coordinator keeps beyond losses: invocations, used updates,
failures; and the job record's per-invocation report built from them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from functions.runtimes import InvocationRecord


@dataclass
class UsedUpdate:
    """An update that went into a snapshot, for the job record."""

    worker: int
    computed_on: int
    applied_in: int
    duration_s: float
    cold_start: bool
    cost_usd: float
    #: The share of its step the update got (1 when fresh; see ``retrain.folding``).
    weight: float = 1.0
    #: The invocation that computed it.
    request_id: str = ""

    @property
    def staleness(self) -> int:
        return self.applied_in - self.computed_on


_RECORD_FIELDS = {f.name for f in dataclasses.fields(InvocationRecord)}


@dataclass
class CoordinatorStats:
    """What the job record keeps beyond losses: every used update and every failure."""

    used: list[UsedUpdate] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    invocations: list[InvocationRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "used": [dataclasses.asdict(u) for u in self.used],
            "failures": [dict(f) for f in self.failures],
            "invocations": [r.as_dict() for r in self.invocations],
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> CoordinatorStats:
        return cls(
            used=[UsedUpdate(**u) for u in state["used"]],
            failures=[dict(f) for f in state["failures"]],
            invocations=[
                InvocationRecord(**{k: v for k, v in r.items() if k in _RECORD_FIELDS})
                for r in state["invocations"]
            ],
        )

    def invocation_report(self) -> list[dict[str, Any]]:
        """Per worker invocation: timings, outcome and cost, and for its update the epoch
        it was folded into (``applied_in``, None if it never was) with the share of its
        step it got (``weight``). Plain JSON, for the job record."""
        used = {u.request_id: u for u in self.used}
        rows = []
        for record in self.invocations:
            update = used.get(record.request_id)
            rows.append(
                {
                    **{k: getattr(record, k) for k in _REPORTED},
                    **{k: record.labels.get(k) for k in ("worker", "epoch")},
                    "applied_in": update.applied_in if update else None,
                    "weight": update.weight if update else None,
                }
            )
        return rows

    @property
    def cost_usd(self) -> float:
        """The bill of every invocation recorded so far."""
        return sum(record.cost_usd for record in self.invocations)


_REPORTED = (
    "request_id",
    "status",
    "cold_start",
    "memory_mb",
    "queued_s",
    "duration_s",
    "init_duration_s",
    "billed_ms",
    "cost_usd",
    "error",
)
