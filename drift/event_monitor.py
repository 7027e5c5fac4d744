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

The monitor reads each heartbeat's errors and wires collaborators with one job each:
``drift.event_feed`` feeds the river detector, ``drift.event_record`` keeps the recent
errors and locates a change in them, ``drift.event_confirm`` judges whether a change is
drift, and ``drift.event_state`` saves and restores all of it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from drift.base import DriftDetector, RecordLoader
from drift.event_confirm import RiseConfirmation
from drift.event_feed import RiverFeed
from drift.event_record import BLOCK, ErrorRecord
from drift.event_state import StateError, restore_state, save_state, with_record_read
from drift.heartbeat import Heartbeat
from drift.monitor import DriftAlert

__all__ = ["EventDriftMonitor"]


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
        if reference_events < 2 * BLOCK or min_events < 1:
            raise ValueError("reference_events must be >= 200 and min_events >= 1")
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
        self._feed = RiverFeed(self.detector, self.detector_params, self.block, self.level_events)
        self._record = ErrorRecord(self.reference_events)
        self._confirmation = RiseConfirmation(self._record, self)
        self._drift_detected = False

    def on_swap(self, continues_regime: bool = False) -> None:
        if not continues_regime:
            self.reset()

    @property
    def level(self) -> float | None:
        """The error level (mean squared error) a rise is measured against, learnt from
        the first ``level_events`` errors of the regime; None until then. The dashboard
        draws the alert threshold from it."""
        return self._feed.level

    @property
    def n_changes(self) -> int:
        """Raw changes of the river detector since the last reset, confirmed or not."""
        return self._feed.changes

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
        return save_state(self._record, self._feed, self._confirmation)

    def state_apart(self) -> tuple[dict[str, Any], ErrorRecord | None]:
        """``state`` without the errors and keys, and the record that holds them."""
        state = save_state(self._record, self._feed, self._confirmation, with_record=False)
        return state, self._record

    def restore(self, state: dict[str, Any]) -> None:
        """Take back what ``state`` returned.

        Raises
        ------
        ValueError
            When the saved errors are not finite values in [0, 1], the saved level is
            not a positive number, ADWIN's saved window does not load or the user keys
            do not match the errors; the monitor is left reset.
        """
        self.reset()
        try:
            restore_state(state, self._record, self._feed, self._confirmation)
        except StateError:
            self.reset()
            raise

    def restore_apart(self, state: dict[str, Any], load_record: RecordLoader) -> None:
        """``restore`` from a state saved by ``state_apart``, its errors read back with
        ``load_record``."""
        self.reset()
        self.restore(with_record_read(state, load_record))

    def update(self, heartbeat: Heartbeat) -> DriftAlert | None:
        """Feed one heartbeat's events; return an alert if they complete a confirmed drift.

        At most one alert per heartbeat: after an alert the record restarts, so the
        same rise is never reported twice.
        """
        errors = np.minimum(_event_errors(heartbeat), self.scale)
        normalised = errors / self.scale
        keys = _event_keys(heartbeat, normalised.size)
        self._drift_detected = False
        self._confirmation.relocate()  # a candidate's change point may lie before the change
        alert: DriftAlert | None = None
        start = 0
        # The feed never depends on what a judgement does, so the detector can take the
        # whole heartbeat before the changes it signalled are judged in order.
        for position in self._feed.feed_all(normalised):
            self._append(normalised[start : position + 1], keys[start : position + 1])
            start = position + 1
            within = self._confirmation.signalled()
            recent = self._record.recent_length(self.min_events, within)
            found = self._confirmation.judge(heartbeat, normalised.size - start, recent)
            if found is not None and alert is None:
                alert = found
        self._append(normalised[start:], keys[start:])
        confirmation = self._confirmation
        if alert is None and confirmation.candidate is not None:
            # A rise too thin to confirm when the detector saw it: judge it again now
            # that more users have been seen since.
            alert = confirmation.judge(heartbeat, 0, confirmation.candidate)
        elif alert is None and confirmation.rechecks > 0:
            # A signal whose change showed no rise yet: the detector restarted at it,
            # so look for the rise again among the errors since.
            recent = self._record.recent_length(self.min_events, confirmation.recheck())
            alert = confirmation.judge(heartbeat, 0, recent)
        self._drift_detected = alert is not None
        return alert

    def _append(self, values: np.ndarray, keys: np.ndarray) -> None:
        self._confirmation.age(values.size)
        self._record.append(values, keys)


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
