"""The live feed: a ring buffer of recent heartbeats, alerts, jobs and swaps for the dashboard.

Publishers must never wait on a browser: ``publish`` appends under a short lock and
returns, the oldest events fall off the end, and readers copy what they need under the
same lock. Every event gets an increasing id, so a browser that reconnects with
``Last-Event-ID`` resumes where it stopped; an id older than the buffer means the
browser missed events and should reload from the JSON endpoints (the source of truth).

Examples
--------
>>> buffer = EventBuffer(capacity=2)
>>> [buffer.publish("heartbeat", {"rmse": r}).id for r in (0.9, 0.95, 1.1)]
[1, 2, 3]
>>> [event.id for event in buffer.since(1)]
[2, 3]
>>> buffer.missed(0)
True
>>> buffer.newest_id
3
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["DashboardEvent", "EventBuffer"]


@dataclass(frozen=True)
class DashboardEvent:
    """One event for the browser: ``kind`` is heartbeat, alert, job, swap or rollout."""

    id: int
    kind: str
    data: dict[str, Any]


class EventBuffer:
    """The last ``capacity`` events, safe to publish and read from different threads."""

    def __init__(self, capacity: int = 1024) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._events: deque[DashboardEvent] = deque(maxlen=capacity)
        self._next_id = 1
        self._lock = threading.Lock()

    def publish(self, kind: str, data: dict[str, Any]) -> DashboardEvent:
        """Append an event and return it with its id; never blocks on readers."""
        with self._lock:
            event = DashboardEvent(self._next_id, kind, dict(data))
            self._next_id += 1
            self._events.append(event)
        return event

    def since(self, last_id: int) -> list[DashboardEvent]:
        """The buffered events after ``last_id``, oldest first (a copy)."""
        with self._lock:
            return [event for event in self._events if event.id > last_id]

    @property
    def newest_id(self) -> int:
        """The id of the newest event published (0: none yet)."""
        with self._lock:
            return self._next_id - 1

    def missed(self, last_id: int) -> bool:
        """Whether events after ``last_id`` have already fallen off the buffer."""
        with self._lock:
            return bool(self._events) and self._events[0].id > last_id + 1
