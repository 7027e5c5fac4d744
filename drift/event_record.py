"""The recent errors of :class:`drift.event_monitor.EventDriftMonitor`, with their users.

River's detectors say *that* the errors changed; the record keeps the errors to say
where, and what the level was before and after.
"""

from __future__ import annotations

import math
import secrets

import numpy as np

from drift.monitor import split_means

__all__ = ["BLOCK", "MAX_RECENT", "ErrorRecord", "new_epoch"]

#: Errors per block when locating a change: block means are smooth enough for a
#: least-squares split, and a record of 20,000 errors is 200 blocks.
BLOCK = 100
#: Longest recent segment compared with the reference; beyond it a change is old news.
MAX_RECENT = 15_000


def new_epoch() -> int:
    """A fresh record's name: random, so two records (a restart's, another replica's)
    never share one; below 2**52, so it survives any JSON reader."""
    return secrets.randbits(52)


class ErrorRecord:
    """The last ``reference_events + MAX_RECENT`` normalised errors and user keys.

    The errors are float16: three digits of a value in [0, 1] are plenty for block
    means, and halve what is saved of them.

    The record only grows at its end between restarts of it, so it can be saved as it
    grows (``since``) instead of whole: ``epoch`` names the record since its last
    ``clear`` or ``load`` and ``end`` counts the errors appended in that epoch, so
    ``values[i]`` is error number ``end - size + i`` of the epoch.
    """

    def __init__(self, reference_events: int) -> None:
        self.keep = reference_events + MAX_RECENT
        self.values = np.empty(0, dtype=np.float16)
        self.keys = np.empty(0, dtype=np.uint16)
        self.epoch = new_epoch()
        self.end = 0

    @property
    def size(self) -> int:
        return int(self.values.size)

    @property
    def start(self) -> int:
        """Number, in the epoch, of the oldest error held."""
        return self.end - self.size

    def append(self, values: np.ndarray, keys: np.ndarray) -> None:
        """Add errors (any float dtype) and their user keys, dropping the oldest."""
        if values.size:
            self.keys = np.concatenate([self.keys, keys])[-self.keep :]
            joined = np.concatenate([self.values, values.astype(np.float16)])
            self.values = joined[-self.keep :]
            self.end += int(values.size)

    def since(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """The errors and keys appended after error number ``end`` of the epoch (all
        held when ``end`` is older than the oldest held)."""
        skip = max(0, end - self.start)
        return self.values[skip:], self.keys[skip:]

    def load(
        self, values: np.ndarray, keys: np.ndarray, epoch: int | None = None, end: int | None = None
    ) -> None:
        """Replace the record by (copies of) the last errors and keys given: those
        ending at error ``end`` of ``epoch``, or a new epoch's first."""
        self.values = values[-self.keep :].copy()
        self.keys = keys[-self.keep :].copy()
        self.epoch = new_epoch() if epoch is None else epoch
        self.end = self.size if end is None else max(end, self.size)

    def clear(self) -> None:
        self.values = np.empty(0, dtype=np.float16)
        self.keys = np.empty(0, dtype=np.uint16)
        self.epoch = new_epoch()
        self.end = 0

    def recent_length(self, min_events: int, within: int | None = None) -> int:
        """Errors since the change: the least-squares change point of the record, among
        the last ``within`` errors (None: anywhere).

        River's detectors say *that* the errors changed, not where: ADWIN's window
        after its cut still holds thousands of errors from before the change, whose
        mean would dilute the rise. The split of the record's block means that best
        separates a lower level from a higher one places the change to within a
        block. Only rises count, since only a rise is drift: a record that opens
        higher (the first errors after a restart) can hold a fall larger than the rise
        the detector signalled, and judged at that fall the rise would be dropped while
        a detector restarted by its own signal takes thousands of events to signal again.
        ``within`` bounds the search to where the change can be: a change the detector
        signalled now is among the errors it saw since its previous signal, and a
        split further back would date the change to a slow creep of the level before it
        (a version serving long without a swap) that dilutes the rise. 0 when the record
        is too short to hold ``min_events`` errors either side.
        """
        blocks = self.values.size // BLOCK
        min_blocks = max(1, math.ceil(min_events / BLOCK))
        if within is not None:
            blocks = min(blocks, math.ceil(within / BLOCK) + min_blocks)
        if blocks < 2 * min_blocks:
            return 0
        tail = self.values[self.values.size - blocks * BLOCK :]
        means = tail.reshape(blocks, BLOCK).mean(axis=1, dtype=np.float64)
        _, _, split = split_means(means, min_blocks, rises_only=True)
        return (blocks - split) * BLOCK
