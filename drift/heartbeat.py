"""Heartbeat aggregation of the prequential error stream.

Single errors on rating data are heavy-tailed, and a few unlucky users look like a
change. Grouping the squared errors into heartbeats of a fixed number of events turns
the stream into a short, much smoother RMSE series that the drift monitor can watch,
and gives the service a regular point at which to report accuracy and save state
(sizing: ``docs/decisions/0001-drift-detector-and-heartbeats.md``).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from drift.batch_ids import distinct

__all__ = ["Heartbeat", "HeartbeatAggregator", "UserKeys", "user_key"]


@dataclass(frozen=True)
class Heartbeat:
    """The accuracy of the serving model over one group of labelled events.

    Attributes
    ----------
    index
        0-based number of this heartbeat since the aggregator was built.
    events
        Number of squared errors in this heartbeat.
    events_seen
        Cumulative number of squared errors up to and including this heartbeat.
    rmse
        Root mean squared error over the heartbeat's events.
    squared_errors
        The heartbeat's squared errors in arrival order, for detectors that watch single
        events rather than the RMSE series. Shorter than ``events`` only for the first
        heartbeat after a restart, whose earlier pending errors were saved as a sum.
    """

    index: int
    events: int
    events_seen: int
    rmse: float
    squared_errors: np.ndarray = field(
        default_factory=lambda: np.empty(0), compare=False, repr=False
    )
    #: 16-bit keys of the events' users, aligned with ``squared_errors`` (empty when the
    #: caller gave none): enough to tell one user's session from a broad change.
    user_keys: np.ndarray = field(
        default_factory=lambda: np.empty(0, dtype=np.uint16), compare=False, repr=False
    )


class HeartbeatAggregator:
    """Groups squared prediction errors into heartbeats.

    A heartbeat closes for every complete group of ``every_events`` errors. When
    ``every_seconds`` is set, a heartbeat also closes once that much time has passed
    since the previous one closed and at least one error is pending, so a quiet stream
    still reports its accuracy (such a heartbeat holds fewer events).

    Parameters
    ----------
    every_events
        Number of errors in a full heartbeat (at least 1).
    every_seconds
        Longest time between two heartbeats while errors are pending, or ``None`` to
        close heartbeats on the event count only.
    clock
        Source of the current time in seconds; injectable so tests need no sleeps.

    Examples
    --------
    >>> import numpy as np
    >>> agg = HeartbeatAggregator(every_events=4)
    >>> agg.add(np.array([1.0, 1.0, 1.0]))
    []
    >>> beats = agg.add(np.full(6, 4.0))
    >>> [(b.index, b.events, b.events_seen, round(b.rmse, 3)) for b in beats]
    [(0, 4, 4, 1.323), (1, 4, 8, 2.0)]
    >>> agg.pending_events
    1
    """

    def __init__(
        self,
        every_events: int = 500,
        every_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(every_events, bool) or not isinstance(every_events, int | np.integer):
            raise ValueError(f"every_events must be an integer >= 1, got {every_events!r}")
        if every_events < 1:
            raise ValueError(f"every_events must be an integer >= 1, got {every_events!r}")
        if every_seconds is not None and not _positive_finite(every_seconds):
            raise ValueError(
                f"every_seconds must be a finite number > 0 or None, got {every_seconds!r}"
            )
        self.every_events = every_events
        self.every_seconds = every_seconds
        self.clock = clock
        self._pending_sum = 0.0
        self._pending_count = 0
        self._pending_errors: list[np.ndarray] = []
        self._pending_keys: list[np.ndarray] = []
        self._index = 0
        self._events_seen = 0
        self._last_close = clock()

    @property
    def pending_events(self) -> int:
        """Errors received but not yet part of a closed heartbeat."""
        return self._pending_count

    @property
    def events_seen(self) -> int:
        """Errors inside closed heartbeats so far."""
        return self._events_seen

    def add(self, squared_errors: ArrayLike, user_keys: ArrayLike | None = None) -> list[Heartbeat]:
        """Add squared errors and return the heartbeats they close, oldest first.

        Parameters
        ----------
        squared_errors
            Squared errors of labelled predictions, shape ``(n,)``; any shape is
            flattened. Values must be finite and non-negative: a single NaN or inf
            would poison every later RMSE and ADWIN's running variance.
        user_keys
            Optional 16-bit keys of the events' users (``user_key``), same length;
            without them every event counts as a different user.

        Returns
        -------
        list of Heartbeat
            Possibly empty; a large array may close several heartbeats at once.
        """
        errors = _as_errors(squared_errors)
        if user_keys is None:  # users unknown: each event counts as a user of its own
            user_keys = (np.arange(errors.size) + self._events_seen + self._pending_count) % 2**16
        keys = np.asarray(user_keys, dtype=np.uint16).reshape(-1)
        if keys.size != errors.size:
            raise ValueError(f"{keys.size} user keys for {errors.size} errors")
        beats = self._close_full_groups(errors, keys)
        due = self.flush_if_due()
        if due is not None:
            beats.append(due)
        return beats

    def state(self) -> dict[str, Any]:
        """The pending (not yet closed) errors and the counters, as plain JSON."""
        return {
            "pending_sum": self._pending_sum,
            "pending_count": self._pending_count,
            "index": self._index,
            "events_seen": self._events_seen,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take back ``state``: the next heartbeat closes where it would have.

        Raises
        ------
        ValueError
            When ``state`` cannot come from this aggregator (a pending group as large as
            ``every_events``, negative counts, a non-finite sum), e.g. after
            ``every_events`` changed between two runs; nothing is changed then.
        """
        pending_sum = float(state["pending_sum"])
        pending_count, index, events_seen = (
            int(state["pending_count"]),
            int(state["index"]),
            int(state["events_seen"]),
        )
        if not (math.isfinite(pending_sum) and pending_sum >= 0.0):
            raise ValueError(f"pending_sum must be finite and >= 0, got {pending_sum!r}")
        if not 0 <= pending_count < self.every_events:
            raise ValueError(
                f"pending_count must be in [0, {self.every_events}), got {pending_count}"
            )
        if index < 0 or events_seen < 0:
            raise ValueError(f"index and events_seen must be >= 0, got {index}, {events_seen}")
        self._pending_sum, self._pending_count = pending_sum, pending_count
        # The values are gone; their sum is enough for the RMSE.
        self._pending_errors, self._pending_keys = [], []
        self._index, self._events_seen = index, events_seen

    def flush_if_due(self) -> Heartbeat | None:
        """Close the pending errors as a heartbeat if ``every_seconds`` has passed.

        Returns
        -------
        Heartbeat or None
            The closed heartbeat, or None when time-based closing is off, not due, or
            nothing is pending.
        """
        if self.every_seconds is None or self._pending_count == 0:
            return None
        if self.clock() - self._last_close < self.every_seconds:
            return None
        beat = self._close(self._pending_sum, self._pending_count, *self._take_pending())
        self._pending_sum, self._pending_count = 0.0, 0
        return beat

    def _close_full_groups(self, errors: np.ndarray, keys: np.ndarray) -> list[Heartbeat]:
        """Close every complete group of ``every_events``; keep the remainder pending."""
        size = self.every_events
        need = size - self._pending_count
        if errors.size < need:
            self._pending_sum += float(errors.sum())
            self._pending_count += int(errors.size)
            self._hold(errors, keys)
            return []
        self._hold(errors[:need], keys[:need])
        first = self._close(
            self._pending_sum + float(errors[:need].sum()), size, *self._take_pending()
        )
        beats = [first]
        rest, rest_keys = errors[need:], keys[need:]
        full = rest.size // size
        for group in range(full):
            span = slice(group * size, (group + 1) * size)
            beats.append(self._close(float(rest[span].sum()), size, rest[span], rest_keys[span]))
        tail = slice(full * size, None)
        self._pending_sum, self._pending_count = float(rest[tail].sum()), int(rest[tail].size)
        self._hold(rest[tail], rest_keys[tail])
        return beats

    def _hold(self, errors: np.ndarray, keys: np.ndarray) -> None:
        if errors.size:
            self._pending_errors.append(errors)
            self._pending_keys.append(keys)

    def _take_pending(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._pending_errors:
            return np.empty(0), np.empty(0, dtype=np.uint16)
        pending = np.concatenate(self._pending_errors), np.concatenate(self._pending_keys)
        self._pending_errors, self._pending_keys = [], []
        return pending

    def _close(self, total: float, events: int, errors: np.ndarray, keys: np.ndarray) -> Heartbeat:
        self._events_seen += events
        beat = Heartbeat(
            index=self._index,
            events=events,
            events_seen=self._events_seen,
            rmse=math.sqrt(total / events),
            squared_errors=errors,
            user_keys=keys,
        )
        self._index += 1
        self._last_close = self.clock()
        return beat


def _as_errors(squared_errors: ArrayLike) -> np.ndarray:
    errors = np.asarray(squared_errors, dtype=np.float64).reshape(-1)
    if errors.size and not (np.isfinite(errors).all() and (errors >= 0.0).all()):
        raise ValueError("squared_errors must be finite and non-negative")
    return errors


def _positive_finite(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def user_key(user_id: str) -> int:
    """A stable 16-bit key of ``user_id`` (the same in every process, unlike ``hash``).

    Examples
    --------
    >>> user_key("u1") == user_key("u1"), 0 <= user_key("u1") < 2**16
    (True, True)
    """
    return zlib.crc32(user_id.encode("utf-8")) & 0xFFFF


class UserKeys:
    """``user_key`` of a batch's users, each user's key computed once.

    The keys of a batch are looked up in a dictionary in one pass (the CRC runs only for
    users not seen before), where computing every event's key cost a Python call each.
    The dictionary is dropped and starts afresh once it holds ``limit`` users, so its
    memory stays bounded however many users the stream brings.

    Examples
    --------
    >>> keys = UserKeys()
    >>> keys(["u1", "u2", "u1"]).tolist() == [user_key("u1"), user_key("u2"), user_key("u1")]
    True
    """

    def __init__(self, limit: int = 1_000_000) -> None:
        self.limit = limit
        self._keys: dict[str, int] = {}

    def __call__(self, users: Sequence[str]) -> np.ndarray:
        """The keys of ``users``, shape ``(n,)``, ``uint16``."""
        keys = self._keys
        first, codes = distinct(users)  # each user's string met once
        found = [keys.get(user) for user in first]
        if None in found:
            if len(keys) + len(first) > self.limit:
                keys.clear()
            found = [
                keys[user] if user in keys else keys.setdefault(user, user_key(user))
                for user in first
            ]
        return np.array(found, dtype=np.uint16)[codes]
