"""Retention settings: how long the database keeps events before they move to the archive."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, Field, field_validator

#: Seconds per unit of a duration.
_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_COUNT = re.compile(r"^(\d[\d_,]*)\s*events?$")


@dataclass(frozen=True)
class RetentionPolicy:
    """How much of the event log the database keeps: the events of the last ``seconds``
    or the newest ``events`` (exactly one of the two); older ones are archived.

    Examples
    --------
    >>> parse_retention("30d")
    RetentionPolicy(seconds=2592000.0, events=None)
    >>> parse_retention("5_000_000 events").events
    5000000
    >>> parse_retention("1 event")
    RetentionPolicy(seconds=None, events=1)
    """

    seconds: float | None = None
    events: int | None = None

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.events is None):
            raise ValueError("a retention policy is a duration or a count of events, not both")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"a retention duration must be > 0, got {self.seconds}")
        if self.events is not None and self.events < 1:
            raise ValueError(f"a retention count must be >= 1 event, got {self.events}")


def parse_retention(text: str) -> RetentionPolicy:
    """The policy ``text`` names: ``<n><unit>`` with unit ``s``, ``m``, ``h``, ``d`` or
    ``w`` (``30d``, ``12h``, ``1.5h``), or ``<n> events`` (``5000000 events``; ``_`` and
    ``,`` may group digits).

    >>> parse_retention("90m").seconds
    5400.0
    >>> parse_retention("30 days")
    Traceback (most recent call last):
    ...
    ValueError: event_retention must be a duration (30d, 12h, 90m, 3600s, 2w) or a count of events (5000000 events), got '30 days'
    """  # noqa: E501
    cleaned = text.strip().lower()
    if match := _DURATION.match(cleaned):
        try:
            return RetentionPolicy(seconds=float(match[1]) * _UNITS[match[2]])
        except ValueError as exc:
            raise ValueError(f"event_retention {text!r}: {exc}") from None
    if match := _COUNT.match(cleaned):
        try:
            return RetentionPolicy(events=int(match[1].replace("_", "").replace(",", "")))
        except ValueError as exc:
            raise ValueError(f"event_retention {text!r}: {exc}") from None
    raise ValueError(
        "event_retention must be a duration (30d, 12h, 90m, 3600s, 2w) or a count of "
        f"events (5000000 events), got {text!r}"
    )


class RetentionSettings(BaseModel):
    """Event retention: events older than EVENT_RETENTION move from the database to the
    object store as Parquet partitions, which retraining and replays read when they
    reach back that far (docs/operations.md "Retention")."""

    event_retention: str | None = Field(
        None,
        description="Events older than this are archived to the object store and deleted "
        "from the database: a duration (30d, 12h, 90m, 3600s, 2w) or a count of the newest "
        "events kept (5000000 events). None: the database keeps every event.",
    )
    retention_dedup_horizon_s: float = Field(
        86_400.0,
        ge=0,
        description="Events stored less than this many seconds ago are never archived, "
        "whatever EVENT_RETENTION says: a redelivered event_id is refused as a duplicate "
        "for at least this long (for as long as its event is in the database).",
    )
    retention_batch_rows: int | None = Field(
        None,
        ge=100,
        le=100_000,
        description="Archived events deleted from the database per transaction; after "
        "each the archiver rests three times as long as it took, so ingestion goes on "
        "between them. None: 1,000 on SQLite, whose one write lock ingestion waits on, "
        "and 10,000 on PostgreSQL, where a delete of old rows blocks no insert and each "
        "transaction's commit is what costs.",
    )
    retention_interval_s: float = Field(
        300.0,
        ge=1.0,
        le=86_400.0,
        description="How often the cluster's leader archives the events past EVENT_RETENTION.",
    )

    @field_validator("event_retention")
    @classmethod
    def _check_retention(cls, value: str | None) -> str | None:
        if value is not None:
            parse_retention(value)
        return value

    @property
    def retention_policy(self) -> RetentionPolicy | None:
        """EVENT_RETENTION parsed; None: keep every event."""
        return None if self.event_retention is None else parse_retention(self.event_retention)
