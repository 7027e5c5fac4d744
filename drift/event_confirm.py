"""Whether a change river signalled is drift: the confirmation rules of
:class:`drift.event_monitor.EventDriftMonitor`.

Per-event errors are heavy-tailed and rating streams come in sessions, so most raw
changes are not drift. A change is confirmed when the level after the change point is
enough above the level before it, with users as the unit; a rise large enough but not
yet clear stays a candidate that later heartbeats judge again.
"""

from __future__ import annotations

import math
import threading
from typing import Protocol

import numpy as np
from numba import njit

from drift.event_record import MAX_RECENT, ErrorRecord
from drift.heartbeat import Heartbeat
from drift.monitor import DriftAlert

__all__ = ["RiseConfirmation", "RiseRules", "user_balanced_mean"]

#: Most events one user counts for in a level (see ``user_balanced_mean``).
USER_WEIGHT_CAP = 50
#: Heartbeats after a signal at which a change judged too small is judged again: a
#: detector that signals within a few hundred events of a change leaves too few errors
#: after it for the record's split to find it, and restarted by its own signal it is
#: blind to the new level until the level changes again.
RECHECK_HEARTBEATS = 4


class RiseRules(Protocol):
    """The thresholds a rise is judged by: the monitor's parameters, read at each
    judgement so that a changed parameter takes effect at once."""

    min_relative_drop: float
    reference_events: int
    min_events: int
    name: str
    min_z: float
    min_users: int
    persist_z: float
    persist_heartbeats: int

    @property
    def scale(self) -> float: ...


class RiseConfirmation:
    """Judges rises in ``record`` by ``rules``, keeping the candidate and the streak of
    persistent rises between heartbeats.

    Attributes
    ----------
    candidate : int | None
        Errors since a rise that was large enough but not yet clear of noise.
    streak, streak_beat : int
        Heartbeats in a row at which a rise was large, shared and ``persist_z`` clear,
        and the index of the last one counted.
    unsignalled : int
        Errors appended since the river detector last signalled (or since the record
        restarted): the stretch a change it signals now can lie in.
    rechecks, window : int
        Heartbeats left at which the last signal is judged again, and the errors its
        change can lie in (those before the signal and every one since).
    """

    def __init__(self, record: ErrorRecord, rules: RiseRules) -> None:
        self._record = record
        self._rules = rules
        self.candidate: int | None = None
        self.streak = 0
        self.streak_beat = -1
        self.unsignalled = 0
        self.rechecks = 0
        self.window = 0

    def age(self, added: int) -> None:
        """Count ``added`` errors appended to the record into the candidate's age and
        into the errors since the detector's last signal."""
        self.unsignalled += added
        self.window += added
        if added and self.candidate is not None:
            self.candidate += added
            if self.candidate > MAX_RECENT:
                self.candidate = None  # old news: the next change starts afresh
                self.streak = 0

    def forget(self) -> None:
        """Clear the record and the candidate after an alert."""
        self._record.clear()
        self.candidate = None
        self.streak = 0
        self.unsignalled = 0
        self.rechecks = 0

    def signalled(self) -> int:
        """The detector signalled a change: where it can lie, the errors since its
        previous signal (at most ``MAX_RECENT``, the oldest change a candidate may
        hold); the count starts again, and the signal is judged again at the next
        ``RECHECK_HEARTBEATS`` heartbeats unless it becomes a candidate or an alert."""
        self.window, self.unsignalled = self.unsignalled, 0
        self.rechecks = RECHECK_HEARTBEATS
        return min(self.window, MAX_RECENT)

    def recheck(self) -> int:
        """One of the heartbeats that judge the last signal again: where its change can
        lie now (the count shrinks by one)."""
        self.rechecks -= 1
        return min(self.window, MAX_RECENT)

    def judge(self, heartbeat: Heartbeat, offset: int, recent: int) -> DriftAlert | None:
        """An alert if the last ``recent`` errors are enough above those before them.

        The reference is the record before that segment: up to ``reference_events``
        errors, long enough to average over the sessions of a few heavy users that make
        rating streams bursty. A rise large enough but not yet clear of noise, or seen
        in too few users, stays a candidate that later heartbeats judge again with the
        users they add; a rise that fades below half the minimum is dropped. ``offset``
        counts the heartbeat's errors after the last one in the record.
        """
        rules, record = self._rules, self._record
        if recent < rules.min_events or record.size - recent < rules.min_events:
            return None
        (before, before_var), (after, after_var, users) = self._levels(recent)
        before_rmse = math.sqrt(before * rules.scale)
        after_rmse = math.sqrt(after * rules.scale)
        if after_rmse < before_rmse * (1.0 + rules.min_relative_drop / 2):
            self.candidate = None
            self.streak = 0
            return None
        large = after_rmse >= before_rmse * (1.0 + rules.min_relative_drop)
        spread = math.sqrt(before_var + after_var)
        clear = after - before >= rules.min_z * spread
        shared = users >= rules.min_users
        persisted = self._persisted(heartbeat, large and shared, after - before, spread)
        if not (large and (clear or persisted) and shared):
            self.candidate = recent
            return None
        self.forget()
        end = heartbeat.events_seen - offset
        return DriftAlert(
            metric="rmse",
            before=before_rmse,
            after=after_rmse,
            events_seen=heartbeat.events_seen,
            heartbeat_index=heartbeat.index,
            change_events=max(0, end - recent),
            detector=rules.name,
        )

    def relocate(self) -> None:
        """Move the candidate's change point later where a split after it shows a
        larger relative rise.

        A candidate keeps the change point found when the detector signalled. That
        point can lie before the change, and the errors between dilute the rise for as
        long as the candidate lives, so a rise just large enough never reads as large
        enough (``docs/decisions/0001``). So at each heartbeat
        the split is searched again among the candidate's errors, and taken when it is
        later and the level after it stands further above the level before it.
        """
        rules, record, candidate = self._rules, self._record, self.candidate
        if candidate is None or candidate < rules.min_events:
            return
        found = record.recent_length(rules.min_events, candidate)
        if not (rules.min_events <= found < candidate):
            return
        if record.size - found >= rules.min_events and self._rise(found) > self._rise(candidate):
            self.candidate = found

    def _levels(self, recent: int) -> tuple[tuple[float, float], tuple[float, float, int]]:
        """``(level, variance)`` of the reference before the last ``recent`` errors, and
        ``(level, variance, users)`` of those errors (``user_balanced_mean``)."""
        record = self._record
        older = slice(max(0, record.size - recent - self._rules.reference_events), -recent)
        before, before_var, _ = user_balanced_mean(record.values[older], record.keys[older])
        return (before, before_var), user_balanced_mean(
            record.values[-recent:], record.keys[-recent:]
        )

    def _rise(self, recent: int) -> float:
        """The level of the last ``recent`` errors relative to the level before them."""
        (before, _), (after, _, _) = self._levels(recent)
        return after / before if before > 0 else math.inf

    def _persisted(
        self, heartbeat: Heartbeat, large_and_shared: bool, rise: float, spread: float
    ) -> bool:
        """Count this heartbeat into the streak of persistent rises (once per heartbeat)
        or break it; whether the streak is now long enough."""
        if not self._rules.persist_heartbeats:
            return False
        if not (large_and_shared and rise >= self._rules.persist_z * spread):
            self.streak = 0
            return False
        if heartbeat.index != self.streak_beat:
            self.streak += 1
            self.streak_beat = heartbeat.index
        return self.streak >= self._rules.persist_heartbeats


def user_balanced_mean(values: np.ndarray, keys: np.ndarray) -> tuple[float, float, int]:
    """Mean error with each user's weight capped at ``USER_WEIGHT_CAP`` events.

    Rating streams come in sessions: one user rating a thousand films in an hour can
    hold half of a few thousand events, and if the model finds that user hard, the
    plain mean rises by a quarter although nothing changed for anyone else. A drift
    worth a retrain moves many users; capping each user's weight makes the level
    before and after the change a level of users, not of sessions.

    Returns
    -------
    tuple
        ``(level, variance of the level, distinct users)``.
    """
    counts, sums = _per_user(values, np.asarray(keys))
    weights = np.minimum(counts, USER_WEIGHT_CAP)
    means = sums / counts
    level = float((weights * means).sum() / weights.sum())
    users = counts.size
    # The cluster-robust variance of a weighted mean, users as clusters, with the
    # small-sample factor G / (G - 1).
    spread = (weights**2 * (means - level) ** 2).sum() / weights.sum() ** 2
    variance = float(spread * users / max(users - 1, 1))
    return level, variance, users


#: Bins of one thread's per-user counts and sums: one per possible 16-bit user key.
_KEYS = 1 << 16
_scratch = threading.local()


def _per_user(values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each user's error count and sum, users in key order, sums in arrival order (as
    ``np.unique`` and ``np.bincount`` give them).

    One compiled pass counts into a bin per possible key, kept between calls and
    cleared only where it was used: sorting 20,000 errors was most of the detector's
    time, and so was a fresh array of 65,536 bins.
    """
    keys = np.asarray(keys)
    if keys.dtype != np.uint16:
        if keys.size and (keys.min() < 0 or keys.max() >= _KEYS):
            raise ValueError("user keys must be integers in [0, 65535]")
        keys = keys.astype(np.uint16)
    bins = getattr(_scratch, "bins", None)
    if bins is None:
        bins = _scratch.bins = (np.zeros(_KEYS, dtype=np.int64), np.zeros(_KEYS))
    return _count_per_user(values.astype(np.float64), keys, *bins)


@njit(cache=True, nogil=True)
def _count_per_user(
    values: np.ndarray, keys: np.ndarray, counts: np.ndarray, sums: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Counts and sums per key present, in key order; ``counts`` and ``sums`` are
    all-zero scratch bins, left all-zero."""
    touched = np.empty(keys.size, dtype=np.int64)
    used = 0
    for i in range(keys.size):
        key = keys[i]
        if counts[key] == 0:
            touched[used] = key
            used += 1
        counts[key] += 1
        sums[key] += values[i]
    present = np.sort(touched[:used])
    found_counts = np.empty(used, dtype=np.int64)
    found_sums = np.empty(used)
    for j in range(used):
        key = present[j]
        found_counts[j] = counts[key]
        found_sums[j] = sums[key]
        counts[key] = 0
        sums[key] = 0.0
    return found_counts, found_sums
