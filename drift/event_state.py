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

from drift.base import RecordLoader
from drift.event_confirm import RiseConfirmation
from drift.event_feed import RiverFeed
from drift.event_record import ErrorRecord

__all__ = ["StateError", "encode_record", "restore_state", "save_state", "with_record_read"]


class StateError(ValueError):
    """A saved state that does not load; the monitor resets rather than keep half of it."""


def save_state(
    record: ErrorRecord,
    feed: RiverFeed,
    confirmation: RiseConfirmation,
    *,
    with_record: bool = True,
) -> dict[str, Any]:
    """The state of a monitor made of these collaborators, as plain JSON.

    ``record`` names the error record (its epoch, and the numbers of the errors held in
    it: ``start`` to ``end``); ``with_record=False`` leaves
    out the errors and keys themselves, for a caller that saves them as they grow
    (``ErrorRecord.since``) and puts them back (``with_record_read``) before a restore.
    """
    state: dict[str, Any] = {
        "record": {"epoch": record.epoch, "start": record.start, "end": record.end},
        "changes": feed.changes,
        "partial": list(feed.partial),
        "candidate": confirmation.candidate,
        "streak": [confirmation.streak, confirmation.streak_beat],
        "unsignalled": confirmation.unsignalled,
        "rechecks": [confirmation.rechecks, confirmation.window],
        "level": feed.level,
    }
    if with_record:
        state.update(encode_record(record.values, record.keys))
    window = feed.adwin_window()
    if window is not None:
        state["adwin"] = base64.b64encode(window).decode("ascii")
    return state


def encode_record(values: np.ndarray, keys: np.ndarray) -> dict[str, str]:
    """Errors (float16) and user keys (uint16) as the state's ``errors`` and ``users``."""
    return {
        "errors": base64.b64encode(values.astype(np.float16).tobytes()).decode("ascii"),
        "users": base64.b64encode(keys.astype(np.uint16).tobytes()).decode("ascii"),
    }


def with_record_read(state: dict[str, Any], load_record: RecordLoader) -> dict[str, Any]:
    """``state`` saved without its errors and keys, with them read by ``load_record``.

    Raises
    ------
    StateError
        When the state does not name its record or the record is not all saved.
    """
    if "errors" in state:
        return state
    try:
        named = state["record"]
        epoch, start, end = int(named["epoch"]), int(named["start"]), int(named["end"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"saved state names no error record: {exc}") from exc
    found = load_record(epoch, start, end)
    if found is None:
        raise StateError(f"errors {start}..{end} of record {epoch} are not all saved")
    return {**state, **encode_record(*found)}


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
    named = state.get("record")
    if named is None:  # saved before records were named
        record.load(values, keys)
    else:
        try:
            epoch, end = int(named["epoch"]), int(named["end"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"saved record name must be an epoch and an end: {exc}") from exc
        record.load(values, keys, epoch=epoch, end=end)
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
