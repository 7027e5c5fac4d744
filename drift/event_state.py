"""The saved state of :class:`drift.event_monitor.EventDriftMonitor`, as plain JSON.

The monitor's state is written with every heartbeat and read back after a restart, so
the record and the river detector survive it: the errors as float16 and the user keys
as 16-bit integers, both in base64, and ADWIN's window as the bytes its own
serialisation writes (a fixed layout its loader parses, never code to run). Other river
detectors are rebuilt by replaying the saved errors, which restores their reference
closely but not bit for bit.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from drift.event_confirm import RiseConfirmation
from drift.event_feed import RiverFeed
from drift.event_record import ErrorRecord

__all__ = ["StateError", "restore_state", "save_state"]


class StateError(ValueError):
    """A saved state that does not load; the monitor resets rather than keep half of it."""


def save_state(
    record: ErrorRecord, feed: RiverFeed, confirmation: RiseConfirmation
) -> dict[str, Any]:
    """The state of a monitor made of these collaborators, as plain JSON."""
    packed = record.values.astype(np.float16).tobytes()
    state: dict[str, Any] = {
        "errors": base64.b64encode(packed).decode("ascii"),
        "users": base64.b64encode(record.keys.tobytes()).decode("ascii"),
        "changes": feed.changes,
        "partial": list(feed.partial),
        "candidate": confirmation.candidate,
        "streak": [confirmation.streak, confirmation.streak_beat],
        "unsignalled": confirmation.unsignalled,
        "rechecks": [confirmation.rechecks, confirmation.window],
        "level": feed.level,
    }
    window = feed.adwin_window()
    if window is not None:
        state["adwin"] = base64.b64encode(window).decode("ascii")
    return state


def restore_state(
    state: dict[str, Any], record: ErrorRecord, feed: RiverFeed, confirmation: RiseConfirmation
) -> None:
    """Load ``state`` into freshly reset collaborators.

    Raises
    ------
    StateError
        When the saved errors are not finite values in [0, 1], the level is not a
        positive number, ADWIN's saved window does not load or the user keys do not
        match the errors.
    """
    raw = base64.b64decode(str(state.get("errors", "")), validate=True)
    values = np.frombuffer(raw, dtype=np.float16)
    partial = [float(value) for value in state.get("partial", [])]
    if not _unit_interval(values) or not _unit_interval(np.asarray(partial)):
        raise StateError("saved errors must be finite values in [0, 1]")
    level = state.get("level")
    if level is not None and not (isinstance(level, int | float) and 0 < level < math.inf):
        raise StateError(f"saved level must be a positive number, got {level!r}")
    feed.level = None if level is None else float(level)
    saved_window = state.get("adwin")
    try:
        if saved_window is not None and feed.load_adwin_window(
            base64.b64decode(str(saved_window), validate=True)
        ):
            feed.partial = partial
        else:
            feed.feed_all(values.astype(np.float64))
    except Exception as exc:  # a corrupt window must not half-restore the monitor
        raise StateError(f"saved ADWIN window does not load: {exc}") from exc
    keys = np.frombuffer(base64.b64decode(str(state.get("users", "")), validate=True), np.uint16)
    if keys.size != values.size:
        raise StateError(f"{keys.size} saved user keys for {values.size} errors")
    record.load(values, keys)
    feed.changes = int(state.get("changes", 0))
    candidate = state.get("candidate")
    confirmation.candidate = None if candidate is None else min(int(candidate), record.size)
    streak, beat = state.get("streak", [0, -1])
    confirmation.streak, confirmation.streak_beat = max(0, int(streak)), int(beat)
    # A state saved before this count was kept: every saved error may hold the change.
    confirmation.unsignalled = max(0, int(state.get("unsignalled", record.size)))
    rechecks, window = state.get("rechecks", [0, 0])
    confirmation.rechecks, confirmation.window = max(0, int(rechecks)), max(0, int(window))


def _unit_interval(values: np.ndarray) -> bool:
    return bool(np.isfinite(values).all() and ((values >= 0) & (values <= 1)).all())
