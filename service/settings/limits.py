"""What an ingested event may carry, and why one is refused.

The stream settings build an :class:`EventLimits`; ``service.ingest.validation`` applies
it to every event, HTTP and Kafka alike. They live here, below both, so that reading
the settings imports nothing of the ingest path.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One reason an event was refused: the field and what is wrong with it."""

    field: str
    message: str


@dataclass(frozen=True)
class EventLimits:
    """The values an event may carry, from the settings.

    Parameters
    ----------
    rating_min, rating_max
        The explicit-feedback scale (MovieLens: 0.5–5.0).
    timestamp_min
        The earliest event time accepted, in seconds since the epoch (default 1990):
        an older one is a unit mistake (milliseconds read as seconds go the other way
        and land centuries ahead) or a forged backfill.
    timestamp_ahead_seconds
        How far past this machine's clock an event may be dated: enough for producers
        whose clocks drift, not enough to plant events that stay "newest" for a year.

    Examples
    --------
    >>> limits = EventLimits(0.5, 5.0, timestamp_min=0.0, timestamp_ahead_seconds=60.0)
    >>> [p.field for p in limits.timestamp_errors(time.time() + 3600)]
    ['timestamp']
    """

    rating_min: float = 0.5
    rating_max: float = 5.0
    timestamp_min: float = 631_152_000.0  # 1990-01-01T00:00:00Z
    timestamp_ahead_seconds: float = 86_400.0

    def timestamp_errors(self, timestamp: float) -> list[Problem]:
        """Why ``timestamp`` is refused, if it is: not finite, or outside the window."""
        if not math.isfinite(timestamp):
            return [Problem("timestamp", f"timestamp must be finite, got {timestamp}")]
        latest = time.time() + self.timestamp_ahead_seconds
        if not self.timestamp_min <= timestamp <= latest:
            return [
                Problem(
                    "timestamp",
                    f"timestamp {timestamp} is outside {self.timestamp_min:.0f}..{latest:.0f} "
                    "(seconds since 1970-01-01 UTC)",
                )
            ]
        return []
