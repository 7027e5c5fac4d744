"""Sessions: the users active at once, and how their events interleave.

``active_users`` slots each hold one user. The stream advances in rounds; in a round each
slot is in a session with probability ``session_share``, and a slot in session emits a
session of events (its length from the fitted session distribution, cut at what is left
of the user's budget). A user whose budget is spent leaves, and a fresh user takes the
slot at once, so the number of active users stays ``active_users`` while the stream
never stops meeting new people. Within a round the sessions' events are merged in a
random order that keeps each session's own order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.streams.params import LogNormal
from benchmarks.streams.population import FreshUsers, Users

__all__ = ["ActiveUsers", "SessionPlan", "interleave"]

#: Rounds whose sessions are drawn at once.
ROUNDS_PER_BLOCK = 256


@dataclass(frozen=True)
class SessionPlan:
    """The sessions of one stretch of stream, in order.

    Attributes
    ----------
    users
        Every user the sessions refer to (rows of a table).
    rows, lengths, rounds, cohort
        Per session (``s``): its user's row in ``users``, its number of events, the
        round it belongs to, and whether its slot was taken over by a planted cohort.
    """

    users: Users
    rows: np.ndarray
    lengths: np.ndarray
    rounds: np.ndarray
    cohort: np.ndarray

    @property
    def events(self) -> int:
        return int(self.lengths.sum())


class ActiveUsers:
    """The slots of the users active at once, and their unspent budgets.

    >>> from benchmarks.streams.params import load_fit
    >>> fit = load_fit()
    >>> rng = np.random.default_rng(0)
    >>> active = ActiveUsers(FreshUsers(fit, rng), size=5)
    >>> plan = active.plan(1_000, fit.session, fit.session_share, rng)
    >>> plan.events >= 1_000, active.events == plan.events
    (True, True)
    """

    def __init__(self, fresh: FreshUsers, size: int) -> None:
        if size < 1:
            raise ValueError(f"need at least one active user, got {size}")
        self.fresh = fresh
        self.users = fresh.take(size)
        self.remaining = self.users.budget.copy()
        self.cohort = np.zeros(size, dtype=bool)
        self.events = 0

    def __len__(self) -> int:
        return len(self.users)

    def plan(
        self,
        target: int,
        lengths: LogNormal,
        session_share: float,
        rng: np.random.Generator,
        stop_at: int | None = None,
    ) -> SessionPlan:
        """Rounds of sessions until at least ``target`` events, or until the round that
        carries the stream past event ``stop_at`` (so a change can start on the next
        round's first event)."""
        size = len(self)
        rows = list(range(size))  # each slot's user: its row in the table below
        remaining = self.remaining.tolist()
        joined = 0  # fresh users taken so far, rows size, size + 1, ...
        ahead: list[int] = []  # budgets of the next fresh users
        out_slots: list[int] = []
        out_rows: list[int] = []
        out_lengths: list[int] = []
        out_rounds: list[int] = []
        planned, round_no = 0, 0
        while planned < target:
            # Who is in session, and for how long, drawn for a block of rounds at once;
            # then the sessions are followed one by one, in round and slot order.
            in_session = rng.random((ROUNDS_PER_BLOCK, size)) < session_share
            block_rounds, block_slots = np.nonzero(in_session)
            block_lengths = lengths.draw(rng, block_slots.size).tolist()
            stopped = False
            for r, slot, length in zip(
                block_rounds.tolist(), block_slots.tolist(), block_lengths, strict=True
            ):
                done = planned >= target or (
                    stop_at is not None and self.events < stop_at <= self.events + planned
                )
                if done and (not out_rounds or out_rounds[-1] != round_no + r):
                    stopped = True  # only at a round's boundary
                    break
                left = remaining[slot]
                taken = length if length < left else left
                out_slots.append(slot)
                out_rows.append(rows[slot])
                out_lengths.append(taken)
                out_rounds.append(round_no + r)
                planned += taken
                if taken == left:  # spent: a fresh user takes the slot
                    if joined == len(ahead):
                        ahead = self.fresh.budgets(2 * joined + 64)
                    rows[slot] = size + joined
                    remaining[slot] = ahead[joined]
                    joined += 1
                else:
                    remaining[slot] = left - taken
            if stopped:
                break
            round_no += ROUNDS_PER_BLOCK
        parts = [self.users] + ([self.fresh.take(joined)] if joined else [])
        table = parts[0] if len(parts) == 1 else Users.concat(parts)
        self.users = table.take(np.asarray(rows))
        self.remaining = np.asarray(remaining, dtype=np.int64)
        self.events += planned
        slots_of = np.asarray(out_slots, dtype=np.int64)
        return SessionPlan(
            table,
            np.asarray(out_rows, dtype=np.int64),
            np.asarray(out_lengths, dtype=np.int64),
            np.asarray(out_rounds, dtype=np.int64),
            self.cohort[slots_of],
        )

    def turn_over(self, slots: np.ndarray, cohort: bool = True) -> None:
        """Fresh users take ``slots`` now; later users of these slots keep ``cohort``."""
        joined = self.fresh.take(slots.size)
        rows = np.arange(len(self))
        rows[slots] = len(self) + np.arange(slots.size)
        self.users = Users.concat([self.users, joined]).take(rows)
        self.remaining[slots] = joined.budget
        self.cohort[slots] = cohort


def interleave(lengths: np.ndarray, rounds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The session of each event, in stream order (``n``), for sessions of ``lengths``
    events in ``rounds`` (both ``s``, rounds not decreasing).

    Rounds follow one another; within a round each session spreads its events evenly
    over the round, each at a random point of its own slice, so sessions interleave and
    keep their own order.

    >>> order = interleave(np.array([2, 3, 1]), np.array([1, 1, 2]), np.random.default_rng(0))
    >>> sorted(order[:5].tolist()), order[5].item()
    ([0, 0, 1, 1, 1], 2)
    """
    sessions = np.repeat(np.arange(lengths.size), lengths)
    firsts = np.cumsum(lengths) - lengths
    within = np.arange(sessions.size) - firsts[sessions]
    position = rounds[sessions] + (within + rng.random(sessions.size)) / lengths[sessions]
    return sessions[np.argsort(position, kind="stable")]
