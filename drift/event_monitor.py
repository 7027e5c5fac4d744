"""A river detector fed every labelled event's normalised error, confirmed by its size.

Each squared error is divided by the largest one the rating scale allows, so values lie
in [0, 1], the range ADWIN's bound assumes. Fed single events rather than heartbeat
RMSEs (``drift.monitor``), the bound counts thousands of values on each side of a cut
and confirms a rise within a few heartbeats instead of tens.

Per-event errors are heavy-tailed and rating streams come in sessions, so most raw
changes are not drift. A change becomes an alert only when, at the record's
least-squares change point, the level after it is at least ``min_relative_drop`` above
the level before it, with users as the unit (each counts for at most 50 events): the
rise ``min_z`` standard errors clear and shared by ``min_users`` users, or large, shared
and ``persist_z`` clear for ``persist_heartbeats`` heartbeats in a row.

A swap that starts a new regime (a drift retrain, a rollback, the first model) restarts
the detector, so the new version's level is learnt from its first events. A scheduled
swap (a refresh) keeps the record and the detector: its version was trained on the same
stream, so its errors continue the series, and a drifted level must not become the new
reference. Evidence for these choices: ``docs/decisions/0001-drift-detector-and-heartbeats.md``.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import river.drift
from river.base import DriftDetector as RiverDetector

from drift.base import DriftDetector
from drift.heartbeat import Heartbeat
from drift.monitor import DriftAlert, split_means

__all__ = ["EventDriftMonitor"]

#: Errors per block when locating a change: block means are smooth enough for a
#: least-squares split, and a record of 20,000 errors is 200 blocks.
_BLOCK = 100
#: Longest recent segment compared with the reference; beyond it a change is old news.
_MAX_RECENT = 15_000
#: Most events one user counts for in a level (see ``_user_balanced_mean``).
_USER_WEIGHT_CAP = 50


class EventDriftMonitor(DriftDetector):
    """Watches every labelled event's normalised error with a river detector.

    Parameters
    ----------
    detector
        Class name of a river drift detector in ``river.drift`` (``"ADWIN"``,
        ``"PageHinkley"``, ``"KSWIN"``...), fed each squared error divided by the
        square of the rating range. Named rather than passed, so parameters stay plain
        data that ``get_params`` and ``clone`` compare and copy.
    detector_params
        Keyword arguments of that class.
    min_relative_drop
        Smallest relative rise of the RMSE that counts as drift, >= 0.
    rating_range
        ``(lowest, highest)`` rating: the normalisation's scale.
    reference_events
        Errors kept for the before/after comparison, >= 2 blocks of 100.
    min_events
        Fewest errors either side of the change point before an alert may be raised.
    name
        Registry name, recorded with each alert.
    min_z
        Standard errors (users as the unit) by which the rise must clear noise.
    min_users
        Fewest distinct users after the change for it to count as drift.
    persist_z, persist_heartbeats
        A rise judged large, shared by ``min_users`` and at least ``persist_z``
        standard errors clear at ``persist_heartbeats`` heartbeats in a row is
        confirmed as if it were ``min_z`` clear (0 heartbeats: never).
    block
        Errors averaged into each value the river detector sees: 1 feeds every event;
        a detector that runs a test per value (KSWIN's Kolmogorov-Smirnov test) is
        fed block means so its cost stays a small share of the ingest path.
    level_events
        0 feeds the river detector the normalised errors as they are. Otherwise the
        mean of the first ``level_events`` errors after a reset is the stream's level,
        and every value is fed divided by it: a detector with absolute parameters
        (Page-Hinkley's tolerance and threshold) then means "a rise of x %" whether the
        model's RMSE is 0.5 or 1.2, where the bound of ADWIN scales by itself.

    Examples
    --------
    >>> import numpy as np
    >>> from drift.heartbeat import HeartbeatAggregator
    >>> rng = np.random.default_rng(0)
    >>> errors = np.r_[rng.gamma(0.5, 1.6, 20_000), rng.gamma(0.5, 2.2, 5_000)]
    >>> monitor = EventDriftMonitor("ADWIN", {"delta": 0.0002})
    >>> alerts = [
    ...     alert
    ...     for beat in HeartbeatAggregator(500).add(errors)
    ...     if (alert := monitor.update(beat)) is not None
    ... ]
    >>> len(alerts), 20_000 < alerts[0].events_seen <= 22_500
    (1, True)
    >>> round(alerts[0].after / alerts[0].before, 1)
    1.2
    """

    def __init__(
        self,
        detector: str = "ADWIN",
        detector_params: dict[str, Any] | None = None,
        min_relative_drop: float = 0.1,
        rating_range: tuple[float, float] = (0.5, 5.0),
        reference_events: int = 5_000,
        min_events: int = 500,
        name: str = "adwin-event",
        min_z: float = 3.0,
        min_users: int = 20,
        block: int = 1,
        persist_z: float = 1.5,
        persist_heartbeats: int = 4,
        level_events: int = 0,
    ) -> None:
        super().__init__()
        if not (math.isfinite(min_relative_drop) and min_relative_drop >= 0.0):
            raise ValueError(f"min_relative_drop must be finite and >= 0, got {min_relative_drop}")
        low, high = rating_range
        if not high > low:
            raise ValueError(
                f"rating_range must be (low, high) with high > low, got {rating_range}"
            )
        if reference_events < 2 * _BLOCK or min_events < 1:
            raise ValueError("reference_events must be >= 200 and min_events >= 1")
        if not isinstance(getattr(river.drift, detector, None), type):
            raise ValueError(f"river.drift has no detector {detector!r}")
        self.detector = detector
        self.detector_params = dict(detector_params or {})
        self.min_relative_drop = min_relative_drop
        self.rating_range = rating_range
        self.reference_events = reference_events
        self.min_events = min_events
        self.name = name
        self.min_z = min_z
        self.min_users = min_users
        if persist_heartbeats < 0:
            raise ValueError(f"persist_heartbeats must be >= 0, got {persist_heartbeats}")
        self.persist_z = persist_z
        self.persist_heartbeats = persist_heartbeats
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        if level_events < 0:
            raise ValueError(f"level_events must be >= 0, got {level_events}")
        self.block = block
        self.level_events = level_events
        self.reset()

    def reset(self) -> None:
        self._river: RiverDetector = getattr(river.drift, self.detector)(**self.detector_params)
        self._record = np.empty(0, dtype=np.float16)
        self._keys = np.empty(0, dtype=np.uint16)
        #: Errors since a rise that was large enough but not yet clear of noise.
        self._candidate: int | None = None
        #: Heartbeats in a row at which a rise was large, shared and ``persist_z``
        #: clear, and the index of the last one counted.
        self._streak = 0
        self._streak_beat = -1
        self._changes = 0
        self._drift_detected = False
        self._partial: list[float] = []
        #: The stream's level (``level_events``), and the values awaiting it.
        self._level: float | None = None
        self._unleveled: list[float] = []

    def on_swap(self, continues_regime: bool = False) -> None:
        if not continues_regime:
            self.reset()

    @property
    def level(self) -> float | None:
        """The error level (mean squared error) a rise is measured against, learnt from
        the first ``level_events`` errors of the regime; None until then. The dashboard
        draws the alert threshold from it."""
        return self._level

    @property
    def n_changes(self) -> int:
        """Raw changes of the river detector since the last reset, confirmed or not."""
        return self._changes

    @property
    def scale(self) -> float:
        """The largest squared error the rating range allows."""
        low, high = self.rating_range
        return float((high - low) ** 2)

    def state(self) -> dict[str, Any]:
        """The recent normalised errors and the river detector's state, as plain JSON.

        The errors are float16 and the user keys 16-bit, in base64 (at most 20,000 of
        each, 107 kB). ADWIN's window is saved exactly, as the bytes its own
        serialisation writes (a fixed layout its loader parses, never code to run);
        other river detectors are rebuilt by replaying the saved errors, which restores
        their reference closely but not bit for bit.
        """
        packed = self._record.astype(np.float16).tobytes()
        state: dict[str, Any] = {
            "errors": base64.b64encode(packed).decode("ascii"),
            "users": base64.b64encode(self._keys.tobytes()).decode("ascii"),
            "changes": self._changes,
            "partial": list(self._partial),
            "candidate": self._candidate,
            "streak": [self._streak, self._streak_beat],
            "level": self._level,
        }
        window = _adwin_window(self._river)
        if window is not None:
            state["adwin"] = base64.b64encode(window).decode("ascii")
        return state

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state`` returned.

        Raises
        ------
        ValueError
            When the saved errors are not finite values in [0, 1] or ADWIN's saved
            window does not load; the monitor is left reset.
        """
        self.reset()
        raw = base64.b64decode(str(state.get("errors", "")), validate=True)
        values = np.frombuffer(raw, dtype=np.float16)
        partial = [float(value) for value in state.get("partial", [])]
        if not _unit_interval(values) or not _unit_interval(np.asarray(partial)):
            raise ValueError("saved errors must be finite values in [0, 1]")
        level = state.get("level")
        if level is not None and not (isinstance(level, int | float) and 0 < level < math.inf):
            raise ValueError(f"saved level must be a positive number, got {level!r}")
        self._level = None if level is None else float(level)
        saved_window = state.get("adwin")
        try:
            if saved_window is not None and _load_adwin_window(
                self._river, base64.b64decode(str(saved_window), validate=True)
            ):
                self._partial = partial
            else:
                for value in values.astype(np.float64).tolist():
                    self._feed(value)
        except Exception as exc:  # a corrupt window must not half-restore the monitor
            self.reset()
            raise ValueError(f"saved ADWIN window does not load: {exc}") from exc
        keys = np.frombuffer(
            base64.b64decode(str(state.get("users", "")), validate=True), np.uint16
        )
        if keys.size != values.size:
            self.reset()
            raise ValueError(f"{keys.size} saved user keys for {values.size} errors")
        self._record = values[-(self.reference_events + _MAX_RECENT) :].copy()
        self._keys = keys[-(self.reference_events + _MAX_RECENT) :].copy()
        self._changes = int(state.get("changes", 0))
        candidate = state.get("candidate")
        self._candidate = None if candidate is None else min(int(candidate), self._record.size)
        streak, beat = state.get("streak", [0, -1])
        self._streak, self._streak_beat = max(0, int(streak)), int(beat)

    def update(self, heartbeat: Heartbeat) -> DriftAlert | None:
        """Feed one heartbeat's events; return an alert if they complete a confirmed drift.

        At most one alert per heartbeat: after an alert the record restarts, so the
        same rise is never reported twice.
        """
        errors = np.minimum(_event_errors(heartbeat), self.scale)
        normalised = errors / self.scale
        keys = _event_keys(heartbeat, normalised.size)
        self._drift_detected = False
        alert: DriftAlert | None = None
        start = 0
        for position, value in enumerate(normalised.tolist()):
            if not self._feed(value):
                continue
            self._changes += 1
            self._append(normalised[start : position + 1], keys[start : position + 1])
            start = position + 1
            found = self._confirm(heartbeat, normalised.size - start, self._recent_length())
            if found is not None and alert is None:
                alert = found
        self._append(normalised[start:], keys[start:])
        if alert is None and self._candidate is not None:
            # A rise too thin to confirm when the detector saw it: judge it again now
            # that more users have been seen since.
            alert = self._confirm(heartbeat, 0, self._candidate)
        self._drift_detected = alert is not None
        return alert

    def _feed(self, value: float) -> bool:
        """Pass ``value`` (or, with ``block`` > 1, a completed block's mean) to the river
        detector; whether it signalled a change."""
        if self.block > 1:
            self._partial.append(value)
            if len(self._partial) < self.block:
                return False
            value = sum(self._partial) / self.block
            self._partial = []
        if not self.level_events:
            self._river.update(value)
            return bool(self._river.drift_detected)
        if self._level is None:
            self._unleveled.append(value)
            if len(self._unleveled) < max(1, self.level_events // self.block):
                return False
            self._level = max(float(np.mean(self._unleveled)), 1e-9)
            pending, self._unleveled = self._unleveled, []
            return any(self._river_update(v / self._level) for v in pending)
        return self._river_update(value / self._level)

    def _river_update(self, value: float) -> bool:
        self._river.update(value)
        return bool(self._river.drift_detected)

    def _forget(self) -> None:
        self._record = np.empty(0, dtype=np.float16)
        self._keys = np.empty(0, dtype=np.uint16)
        self._candidate = None
        self._streak = 0

    def _append(self, values: np.ndarray, keys: np.ndarray) -> None:
        if values.size and self._candidate is not None:
            self._candidate += values.size
            if self._candidate > _MAX_RECENT:
                self._candidate = None  # old news: the next change starts afresh
                self._streak = 0
        if values.size:
            self._keys = np.concatenate([self._keys, keys])[
                -(self.reference_events + _MAX_RECENT) :
            ]
            # float16 keeps three digits of a value in [0, 1], plenty for block means,
            # and halves what every heartbeat writes with the monitor's state.
            keep = self.reference_events + _MAX_RECENT
            joined = np.concatenate([self._record, values.astype(np.float16)])
            self._record = joined[-keep:]

    def _confirm(self, heartbeat: Heartbeat, offset: int, recent: int) -> DriftAlert | None:
        """An alert if the last ``recent`` errors are enough above those before them.

        The reference is the record before that segment: up to ``reference_events``
        errors, long enough to average over the sessions of a few heavy users that make
        rating streams bursty. A rise large enough but not yet clear of noise, or seen
        in too few users, stays a candidate that later heartbeats judge again with the
        users they add; a rise that fades below half the minimum is dropped. ``offset``
        counts the heartbeat's errors after the last one in the record.
        """
        if recent < self.min_events or self._record.size - recent < self.min_events:
            return None
        older = slice(max(0, self._record.size - recent - self.reference_events), -recent)
        before, before_var, _ = _user_balanced_mean(self._record[older], self._keys[older])
        after, after_var, users = _user_balanced_mean(self._record[-recent:], self._keys[-recent:])
        before_rmse = math.sqrt(before * self.scale)
        after_rmse = math.sqrt(after * self.scale)
        if after_rmse < before_rmse * (1.0 + self.min_relative_drop / 2):
            self._candidate = None
            self._streak = 0
            return None
        large = after_rmse >= before_rmse * (1.0 + self.min_relative_drop)
        spread = math.sqrt(before_var + after_var)
        clear = after - before >= self.min_z * spread
        shared = users >= self.min_users
        persisted = self._persisted(heartbeat, large and shared, after - before, spread)
        if not (large and (clear or persisted) and shared):
            self._candidate = recent
            return None
        self._forget()
        end = heartbeat.events_seen - offset
        return DriftAlert(
            metric="rmse",
            before=before_rmse,
            after=after_rmse,
            events_seen=heartbeat.events_seen,
            heartbeat_index=heartbeat.index,
            change_events=max(0, end - recent),
            detector=self.name,
        )

    def _persisted(
        self, heartbeat: Heartbeat, large_and_shared: bool, rise: float, spread: float
    ) -> bool:
        """Count this heartbeat into the streak of persistent rises (once per heartbeat)
        or break it; whether the streak is now long enough."""
        if not self.persist_heartbeats:
            return False
        if not (large_and_shared and rise >= self.persist_z * spread):
            self._streak = 0
            return False
        if heartbeat.index != self._streak_beat:
            self._streak += 1
            self._streak_beat = heartbeat.index
        return self._streak >= self.persist_heartbeats

    def _recent_length(self) -> int:
        """Errors since the change: the least-squares change point of the record.

        River's detectors say *that* the errors changed, not where: ADWIN's window
        after its cut still holds thousands of errors from before the change, whose
        mean would dilute the rise. The split of the record's block means that best
        separates a lower level from a higher one places the change to within a
        block. Only rises count, since only a rise is drift: a record that opens
        higher (the first errors after a restart) can hold a fall larger than the rise
        the detector signalled, and judged at that fall the rise would be dropped while
        a detector restarted by its own signal takes thousands of events to signal again.
        """
        blocks = self._record.size // _BLOCK
        min_blocks = max(1, math.ceil(self.min_events / _BLOCK))
        if blocks < 2 * min_blocks:
            return 0
        tail = self._record[self._record.size - blocks * _BLOCK :]
        means = tail.reshape(blocks, _BLOCK).mean(axis=1, dtype=np.float64)
        _, _, split = split_means(means, min_blocks, rises_only=True)
        return (blocks - split) * _BLOCK


def _event_errors(heartbeat: Heartbeat) -> np.ndarray:
    """The heartbeat's squared errors; those it does not carry (its pending part before
    a restart, or a heartbeat built from the RMSE alone) count at the heartbeat's mean."""
    known = np.asarray(heartbeat.squared_errors, dtype=np.float64).reshape(-1)
    missing = heartbeat.events - known.size
    if missing <= 0:
        return known
    return np.concatenate([np.full(missing, heartbeat.rmse**2), known])


def _event_keys(heartbeat: Heartbeat, size: int) -> np.ndarray:
    """The heartbeat's user keys aligned with its errors; where they are missing each
    event counts as a user of its own."""
    keys = np.asarray(heartbeat.user_keys, dtype=np.uint16).reshape(-1)
    if keys.size >= size:
        return keys[-size:]
    missing = (np.arange(size - keys.size) + heartbeat.events_seen) % 2**16
    return np.concatenate([missing.astype(np.uint16), keys])


def _user_balanced_mean(values: np.ndarray, keys: np.ndarray) -> tuple[float, float, int]:
    """Mean error with each user's weight capped at ``_USER_WEIGHT_CAP`` events.

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
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=values.astype(np.float64))
    weights = np.minimum(counts, _USER_WEIGHT_CAP)
    means = sums / counts
    level = float((weights * means).sum() / weights.sum())
    users = counts.size
    # The cluster-robust variance of a weighted mean, users as clusters, with the
    # small-sample factor G / (G - 1).
    spread = (weights**2 * (means - level) ** 2).sum() / weights.sum() ** 2
    variance = float(spread * users / max(users - 1, 1))
    return level, variance, users


def _unit_interval(values: np.ndarray) -> bool:
    return bool(np.isfinite(values).all() and ((values >= 0) & (values <= 1)).all())


def _adwin_window(detector: RiverDetector) -> bytes | None:
    """ADWIN's bucket structure as its own serialisation writes it, or None for other
    detectors (river keeps ADWIN's window in a compiled helper with that format)."""
    helper = getattr(detector, "_helper", None)
    if helper is None or not hasattr(helper, "__reduce_ex__"):
        return None
    reduced = helper.__reduce_ex__(4)
    window = reduced[2] if len(reduced) > 2 else None
    return window if isinstance(window, bytes) else None


def _load_adwin_window(detector: RiverDetector, window: bytes) -> bool:
    """Put ``window`` back into ``detector``'s helper; False when it has none."""
    helper = getattr(detector, "_helper", None)
    if helper is None or not hasattr(helper, "__setstate__"):
        return False
    helper.__setstate__(window)
    return True
