"""Prequential ranking quality: hit-rate@K and NDCG@K on a fixed sample of events.

RMSE says how well a model predicts a rating; a recommender is judged by what it ranks.
For a labelled event the user liked (rating at least ``min_rating``), the question asked
before the event is learnt is: where does the model rank that item among the items the
user has not rated yet (the list ``/recommend`` would show)? With one relevant item per
event, hit-rate@K is the share of events whose item is in the top K and NDCG@K averages
``1 / log2(rank + 1)`` over them (0 past K): the leave-one-out protocol of He et al.
(2017), applied prequentially (``drift.prequential``).

Scoring every item for every event costs far more than predicting one rating, so only a
fixed sample is ranked. The sample is a hash of the event's user, item and timestamp,
not a random draw: every model, every run and every benchmark ranks exactly the same
events, so their figures compare like for like.

This module is only the arithmetic: scores come from whoever owns a model (the serving
view, the never-retrained version, river's ``BiasedMF``), exclusions from whoever holds
the users' histories.

References
----------
He, Liao, Zhang, Nie, Hu & Chua (2017), *Neural Collaborative Filtering*, §4.1:
leave-one-out hit ratio and NDCG at 10 with a single relevant item.
Järvelin & Kekäläinen (2002), *Cumulated gain-based evaluation of IR techniques*.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numba import njit
from numpy.typing import ArrayLike

from drift.batch_ids import distinct, look_up, repeats

__all__ = [
    "DEFAULT_K",
    "NOT_RANKED",
    "RankingSampler",
    "RankingTracker",
    "hits",
    "ndcg",
    "rank_of",
    "ranks_excluding",
    "ranks_of",
    "ranks_of_products",
    "ranks_within",
    "sample_point",
]

#: Length of the list judged: hit-rate@10 and NDCG@10.
DEFAULT_K = 10

#: The rank of an item the model cannot place for the user (unknown user or item, or an
#: item it leaves out as already rated): it can never be recommended, so it is a miss.
NOT_RANKED = 0

_HASH_PERSON = b"driftline-rank"
_HASH_SCALE = float(2**64)
#: Ids whose digest a sampler keeps (cleared whole when full): a stream repeats its
#: users and items, and a digest costs ten times a look-up.
_ID_CACHE_LIMIT = 100_000


def sample_point(user_id: str, item_id: str, timestamp: float | None) -> float:
    """The event's fixed position in [0, 1): the same for every model, run and process.

    A keyed BLAKE2b digest of the user id and of the item id (not Python's ``hash``,
    which changes from process to process), mixed with the timestamp's bits by
    MurmurHash3's 64-bit finaliser, three times over so that no part can cancel another.
    The timestamp is read as a float, so ``964982703`` and ``964982703.0`` are the same
    event; an event without one mixes in a NaN's bits instead.

    Examples
    --------
    >>> point = sample_point("u1", "i9", 964982703)
    >>> 0.0 <= point < 1.0, point == sample_point("u1", "i9", 964982703.0)
    (True, True)
    """
    mixed = _mix([_id_digest(user_id)], [_id_digest(item_id)], [timestamp])
    return float(mixed[0]) / _HASH_SCALE


#: The digest's keyed, empty state: copying it is cheaper than a new one with its options.
_DIGEST = hashlib.blake2b(digest_size=8, person=_HASH_PERSON)


def _id_digest(key: str) -> int:
    return int(_id_digests([key])[0])


def _id_digests(keys: Sequence[str]) -> np.ndarray:
    """Each key's 8-byte BLAKE2b digest (personalised), read big-endian ``(n,)`` uint64."""
    joined = bytearray()
    for key in keys:
        digest = _DIGEST.copy()
        digest.update(key.encode())
        joined += digest.digest()
    return np.frombuffer(joined, dtype=">u8").astype(np.uint64)


@njit(cache=True, nogil=True)
def _fmix64(x: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """MurmurHash3's 64-bit finaliser: every input bit moves every output bit (uint64
    arithmetic wraps around, identically on every platform)."""
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xFF51AFD7ED558CCD)
    x ^= x >> np.uint64(33)
    x *= np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


@njit(cache=True, nogil=True)
def _mix_bits(
    users: np.ndarray, items: np.ndarray, times: np.ndarray
) -> np.ndarray:  # pragma: no cover - compiled
    mixed = np.empty(times.size, dtype=np.uint64)
    for j in range(times.size):
        x = _fmix64(times[j] ^ np.uint64(0x9E3779B97F4A7C15))
        x = _fmix64(x ^ items[j])
        mixed[j] = _fmix64(x ^ users[j])
    return mixed


def _mix(
    users: Sequence[int] | np.ndarray,
    items: Sequence[int] | np.ndarray,
    stamps: Sequence[float | None],
) -> np.ndarray:
    """Each event's 64-bit sample hash, from its ids' digests and its timestamp.

    The timestamps are converted by NumPy in one call, which reads None as NaN and an
    integer as the float ``float()`` would make of it.
    """
    times = np.array(stamps, dtype=np.float64).reshape(-1)
    return _mix_bits(
        np.asarray(users, dtype=np.uint64).reshape(-1),
        np.asarray(items, dtype=np.uint64).reshape(-1),
        times.view(np.uint64),
    )


@dataclass(frozen=True)
class RankingSampler:
    """Which events are ranked: liked ones, in a fixed hash sample.

    Parameters
    ----------
    fraction
        Share of the liked events ranked, in [0, 1]; 0 ranks none, 1 every one. Events
        whose ``sample_point`` is below it are in the sample, so a larger fraction's
        sample contains a smaller one's.
    min_rating
        A labelled event rated at least this is relevant (liked); others are not ranked.

    Examples
    --------
    >>> events = [("u1", "i1", 1.0), ("u3", "i2", 3.0), ("u4", "i5", 4.0)]
    >>> [round(sample_point(*event), 3) for event in events]
    [0.489, 0.744, 0.122]
    >>> sampler = RankingSampler(fraction=0.5, min_rating=4.0)
    >>> sampler.mask(["u1", "u3", "u4", "u4"], ["i1", "i2", "i5", "i5"], [1.0, 3.0, 4.0, 4.0],
    ...              [5.0, 4.5, None, 4.0]).tolist()
    [True, False, False, True]
    >>> RankingSampler(fraction=1.0).includes("u2", "i7", None, 4.0)
    True
    """

    fraction: float = 0.1
    min_rating: float = 4.0
    _digests: _Digests = field(
        default_factory=lambda: _Digests(), init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")

    def includes(
        self, user_id: str, item_id: str, timestamp: float | None, rating: float | None
    ) -> bool:
        """Whether this one event is ranked."""
        return bool(self.mask([user_id], [item_id], [timestamp], [rating])[0])

    def mask(
        self,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        timestamps: Sequence[float | None],
        ratings: Sequence[float | None],
    ) -> np.ndarray:
        """Which of ``n`` events are ranked, a boolean array ``(n,)``.

        Only liked events are hashed, vectorised over the batch, from digests of their
        ids kept between batches: a ranked sample costs the ingest path a few look-ups
        per event rather than a digest.
        """
        n = len(user_ids)
        if not len(item_ids) == len(timestamps) == len(ratings) == n:
            raise ValueError("user_ids, item_ids, timestamps and ratings differ in length")
        chosen = np.zeros(n, dtype=bool)
        if self.fraction <= 0.0 or not n:
            return chosen
        score = np.array(ratings, dtype=np.float64)  # None (unlabelled) reads as NaN
        liked = np.flatnonzero(score >= self.min_rating)
        if liked.size:
            positions = liked.tolist()
            chosen[liked] = self.in_sample(
                [user_ids[j] for j in positions],
                [item_ids[j] for j in positions],
                [timestamps[j] for j in positions],
            )
        return chosen

    def in_sample(
        self,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        timestamps: Sequence[float | None],
    ) -> np.ndarray:
        """Which of ``n`` liked events fall in the hash sample, a boolean array ``(n,)``:
        ``mask`` without the rating test, for a caller that has picked the liked events.

        Hashed vectorised over the batch, from digests of the ids kept between batches:
        a ranked sample costs the ingest path a few look-ups per event, not a digest.
        """
        n = len(user_ids)
        if not len(item_ids) == len(timestamps) == n:
            raise ValueError("user_ids, item_ids and timestamps differ in length")
        if self.fraction <= 0.0 or self.fraction >= 1.0 or not n:
            return np.full(n, self.fraction >= 1.0, dtype=bool)
        return self.points(user_ids, item_ids, timestamps) < self.fraction

    def points(
        self,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        timestamps: Sequence[float | None],
    ) -> np.ndarray:
        """Each event's ``sample_point`` ``(n,)``, from the kept digests: an event is in
        the sample of any fraction above its point, so one sample nests in another."""
        digests = self._digests
        return (
            _mix(digests.of(user_ids), digests.of(item_ids), timestamps).astype(np.float64)
            / _HASH_SCALE
        )


class _Digests:
    """The digests of ids met before, kept between batches (a stream repeats its users
    and items, and a digest costs ten times a look-up), at most ``_ID_CACHE_LIMIT``:
    past it they start afresh, in a new table."""

    def __init__(self) -> None:
        self._table = _DigestTable()

    def of(self, ids: Sequence[str]) -> np.ndarray:
        """The digest of each id ``(n,)`` uint64: each distinct id of a batch that says
        its ids repeat looked up once, the others by code where they carry one."""
        if repeats(ids):
            first, at = distinct(ids)
            return self._of(first)[at]
        return self._of(ids)

    def _of(self, ids: Sequence[str]) -> np.ndarray:
        table = self._table
        slots = look_up(ids, table, table.slot.get)
        missing = np.flatnonzero(slots < 0).tolist()
        if missing:
            new = list(dict.fromkeys(ids[j] for j in missing))
            if len(table.slot) + len(new) > _ID_CACHE_LIMIT:
                table = self._table = _DigestTable()
                slots = table.add(list(dict.fromkeys(ids)), ids)  # may grow ``values``
                return table.values[slots]
            slots[missing] = table.add(new, [ids[j] for j in missing])
        return table.values[slots]


class _DigestTable:
    """Ids' digests in an array, by slot (``slot``: id → slot)."""

    def __init__(self) -> None:
        self.slot: dict[str, int] = {}
        self.values = np.empty(64, dtype=np.uint64)

    def add(self, new: list[str], wanted: Sequence[str]) -> np.ndarray:
        """Digest the ``new`` ids into the next slots; the slot of each ``wanted`` id."""
        start = len(self.slot)
        if start + len(new) > self.values.size:
            grown = np.empty(2 * (start + len(new)), dtype=np.uint64)
            grown[:start] = self.values[:start]
            self.values = grown
        self.values[start : start + len(new)] = _id_digests(new)
        self.slot.update(zip(new, range(start, start + len(new)), strict=True))
        return np.fromiter(map(self.slot.__getitem__, wanted), np.int64, count=len(wanted))


def rank_of(scores: ArrayLike, target: int, exclude: ArrayLike | None = None) -> int:
    """1-based rank of row ``target`` among the rows not excluded.

    Ties are broken by the lower row index, as ``functions.mf.top_k`` breaks them, so
    ``rank_of(...) <= k`` exactly when ``top_k`` would list the target.

    Parameters
    ----------
    scores
        Score of every item for the user, shape ``(n_items,)``.
    target
        Row of the event's item; negative when the model does not know the item.
    exclude
        Rows left out (the items the user rated before), each in ``[0, n_items)``; may
        repeat.

    Returns
    -------
    int
        The rank, or ``NOT_RANKED`` when the target is unknown or excluded.

    Examples
    --------
    >>> rank_of([0.9, 0.2, 0.7, 0.7], target=3)
    3
    >>> rank_of([0.9, 0.2, 0.7, 0.7], target=3, exclude=[0])
    2
    >>> rank_of([0.9, 0.2, 0.7, 0.7], target=0, exclude=[0]), rank_of([0.5], target=-1)
    (0, 0)
    """
    row = np.asarray(scores, dtype=np.float64).reshape(1, -1)
    rows = np.asarray([] if exclude is None else exclude, dtype=np.int64).reshape(-1)
    owners = np.zeros(rows.size, dtype=np.int64)
    return int(ranks_excluding(row, np.array([target]), owners, rows)[0])


def ranks_of(
    scores: np.ndarray,
    targets: ArrayLike,
    excluded: Sequence[Sequence[int] | np.ndarray] | None = None,
    *,
    distinct: bool = False,
) -> np.ndarray:
    """``rank_of`` for ``m`` events at once, vectorised over the batch.

    Parameters
    ----------
    scores
        Scores, shape ``m x n_items``: row ``j`` scores every item for event ``j``'s user.
    targets
        Row of each event's item, shape ``(m,)``; negative for an unknown item.
    excluded
        Per event, the rows to leave out (``m`` arrays of any length), or None.
    distinct
        Accepted for callers that vouch that no list repeats a row; repeats cost
        nothing extra any more, so it changes nothing.

    Returns
    -------
    numpy.ndarray
        int64 ranks ``(m,)``; ``NOT_RANKED`` where the target is unknown or excluded.

    Examples
    --------
    >>> scores = np.array([[0.1, 0.9, 0.5], [0.8, 0.3, 0.3]])
    >>> ranks_of(scores, [2, 2], [[1], []]).tolist()
    [1, 3]
    """
    del distinct
    m = len(scores)
    if excluded is None:
        owners = rows = np.empty(0, dtype=np.int64)
    else:
        if len(excluded) != m:
            raise ValueError(f"{len(excluded)} exclusion lists for {m} score rows")
        lists = [np.asarray(r, dtype=np.int64).reshape(-1) for r in excluded]
        rows = np.concatenate(lists) if lists else np.empty(0, dtype=np.int64)
        owners = np.repeat(np.arange(m), [len(r) for r in lists])
    return ranks_excluding(scores, targets, owners, rows)


def ranks_excluding(
    scores: np.ndarray, targets: ArrayLike, owners: ArrayLike, rows: ArrayLike
) -> np.ndarray:
    """``ranks_of`` with the exclusions flattened: event ``owners[i]`` leaves out row
    ``rows[i]`` (both ``(e,)``, in any order, repeats allowed).

    Compiled: each event's items are counted in one pass over its row of scores, with
    its exclusions marked in a scratch row, so the cost is ``m x n_items`` comparisons
    and no temporaries.

    Examples
    --------
    >>> scores = np.array([[0.1, 0.9, 0.5], [0.8, 0.3, 0.3]])
    >>> ranks_excluding(scores, [2, 2], np.array([0, 0]), np.array([1, 1])).tolist()
    [1, 3]
    """
    scores = np.ascontiguousarray(scores, dtype=np.float64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be m x n_items, got shape {scores.shape}")
    targets, starts, grouped = _checked(scores.shape, targets, owners, rows)
    return _rank_scored(scores, targets, starts, grouped)


def ranks_of_products(
    users: np.ndarray,
    items: np.ndarray,
    shift: np.ndarray,
    targets: ArrayLike,
    owners: ArrayLike,
    rows: ArrayLike,
) -> np.ndarray:
    """``ranks_excluding`` of the scores ``users @ items + shift[:, None]``, without
    holding them: each event's row of scores is computed, ranked and dropped.

    The products are summed over the factors in order, one factor at a time, exactly as
    ``np.einsum("md,dn->mn", users, items)`` sums them, so the ranks are those of the
    einsum's scores to the last tie. An event whose target is unknown or excluded is
    not scored at all.

    Parameters
    ----------
    users
        Each event's user side of the product (``m x d``).
    items
        Every item's side (``d x n_items``).
    shift
        Added to every score of an event (``(m,)``: μ plus the user's bias).
    targets, owners, rows
        As for ``ranks_excluding``.

    Examples
    --------
    >>> users, items = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.3, 0.9], [0.5, 0.1]])
    >>> ranks_of_products(users, items, np.zeros(2), [0, 0], [1], [1]).tolist()
    [2, 1]
    """
    checked = _product_arguments(users, items, shift, targets, owners, rows, by_row=False)
    return _rank_products(*checked)


def ranks_within(
    users: np.ndarray,
    items: np.ndarray,
    shift: np.ndarray,
    targets: ArrayLike,
    owners: ArrayLike,
    rows: ArrayLike,
    within: int = DEFAULT_K,
) -> np.ndarray:
    """``ranks_of_products`` where only the top ``within`` matter: a rank past
    ``within`` is given as ``within + 1``, so hit-rate and NDCG at ``within`` (or any k
    below) are exactly those of the full ranks.

    Each event's items are scored one at a time, in row order, and its count stops once
    ``within + 1`` items are ahead of its target: an event whose item ranks ``r`` of
    ``n`` scores about ``(within + 1) n / r`` items rather than all of them, so ranking
    against a large catalogue costs in proportion to it only for the few events the
    model places near the top. Scores are summed as ``ranks_of_products`` sums them,
    so ties fall the same way.

    Parameters
    ----------
    users, shift, targets, owners, rows
        As for ``ranks_of_products``.
    items
        Every item's side of the product, one row per item (``n_items x d``: the
        transpose of ``ranks_of_products``' ``items``).
    within
        The longest list judged.

    Examples
    --------
    >>> users = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> items = np.array([[0.3, 0.5], [0.9, 0.1], [0.1, 0.2]])  # three items
    >>> ranks_within(users, items, np.zeros(2), [0, 0], [1], [1], within=1).tolist()
    [2, 1]
    """
    if within < 1:
        raise ValueError(f"within must be at least 1, got {within}")
    checked = _product_arguments(users, items, shift, targets, owners, rows, by_row=True)
    return _rank_within(*checked, within)


def _product_arguments(
    users: np.ndarray,
    items: np.ndarray,
    shift: np.ndarray,
    targets: ArrayLike,
    owners: ArrayLike,
    rows: ArrayLike,
    *,
    by_row: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A product's arguments as the kernels take them: contiguous float64 sides that
    multiply (``items`` one row per item when ``by_row``, else one column), a shift per
    user, and the checked targets with the exclusions grouped by event."""
    users = np.ascontiguousarray(users, dtype=np.float64)
    items = np.ascontiguousarray(items, dtype=np.float64)
    shift = np.ascontiguousarray(shift, dtype=np.float64).reshape(-1)
    factors, n = (items.shape[1], len(items)) if by_row else (len(items), items.shape[-1])
    if users.ndim != 2 or items.ndim != 2 or users.shape[1] != factors:
        raise ValueError(f"users {users.shape} and items {items.shape} do not multiply")
    if shift.size != len(users):
        raise ValueError(f"{shift.size} shifts for {len(users)} users")
    targets, starts, grouped = _checked((len(users), n), targets, owners, rows)
    return users, items, shift, targets, starts, grouped


def _checked(
    shape: tuple[int, int], targets: ArrayLike, owners: ArrayLike, rows: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated targets, and the exclusions grouped by event: event j's rows are
    ``grouped[starts[j]:starts[j + 1]]``."""
    m, n = shape
    targets = np.asarray(targets, dtype=np.int64).reshape(-1)
    if targets.size != m:
        raise ValueError(f"{targets.size} targets for {m} score rows")
    owners = np.asarray(owners, dtype=np.int64).reshape(-1)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if owners.size != rows.size:
        raise ValueError(f"{owners.size} owners for {rows.size} excluded rows")
    starts, grouped = _group_by_owner(owners, rows, m)
    problem = _out_of_range(targets, owners, rows, n)
    if problem:
        raise ValueError(_RANGE_PROBLEMS[problem].format(m=m, n=n))
    return targets, starts, grouped


_RANGE_PROBLEMS = {
    1: "a target row is past the {n} scored items",
    2: "an excluded row is outside the {n} scored items",
    3: "an exclusion belongs to no event of the {m}",
}


@njit(cache=True, nogil=True)
def _out_of_range(
    targets: np.ndarray, owners: np.ndarray, rows: np.ndarray, n: int
) -> int:  # pragma: no cover - compiled
    """Which of ``_RANGE_PROBLEMS`` the arguments have, 0 if none (one pass, no
    temporaries: the checks cost less than the NumPy reductions' calls)."""
    for target in targets:
        if target >= n:
            return 1
    for row in rows:
        if row < 0 or row >= n:
            return 2
    for owner in owners:
        if owner < 0 or owner >= targets.size:
            return 3
    return 0


@njit(cache=True, nogil=True)
def _group_by_owner(
    owners: np.ndarray, rows: np.ndarray, m: int
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """A counting sort of ``rows`` by ``owners`` (stable)."""
    starts = np.zeros(m + 1, dtype=np.int64)
    for owner in owners:
        if owner < 0 or owner >= m:  # refused by the caller
            return starts, rows[:0].copy()
        starts[owner + 1] += 1
    for j in range(m):
        starts[j + 1] += starts[j]
    fill = starts[:-1].copy()
    grouped = np.empty_like(rows)
    for at in range(rows.size):
        owner = owners[at]
        grouped[fill[owner]] = rows[at]
        fill[owner] += 1
    return starts, grouped


@njit(cache=True, nogil=True)
def _rank_row(
    row: np.ndarray, target: int, excluded: np.ndarray, marked: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Rank of ``target`` in ``row`` among the rows not ``excluded``; ``marked`` is an
    all-False scratch row, left all-False."""
    chosen = row[target]
    ahead = 0
    for i in range(target):  # a tie from a lower row is ahead
        ahead += row[i] >= chosen
    for i in range(target + 1, row.size):
        ahead += row[i] > chosen
    hit = False
    for r in excluded:
        if marked[r]:  # a repeated exclusion counts once
            continue
        marked[r] = True
        if r == target:
            hit = True
        elif row[r] > chosen or (row[r] == chosen and r < target):
            ahead -= 1
    for r in excluded:
        marked[r] = False
    return NOT_RANKED if hit else 1 + ahead


@njit(cache=True, nogil=True)
def _rank_scored(
    scores: np.ndarray, targets: np.ndarray, starts: np.ndarray, grouped: np.ndarray
) -> np.ndarray:  # pragma: no cover - compiled
    m, n = scores.shape
    ranks = np.full(m, NOT_RANKED, dtype=np.int64)
    marked = np.zeros(n, dtype=np.bool_)
    for j in range(m):
        if targets[j] >= 0:
            excluded = grouped[starts[j] : starts[j + 1]]
            ranks[j] = _rank_row(scores[j], targets[j], excluded, marked)
    return ranks


@njit(cache=True, nogil=True)
def _rank_products(
    users: np.ndarray,
    items: np.ndarray,
    shift: np.ndarray,
    targets: np.ndarray,
    starts: np.ndarray,
    grouped: np.ndarray,
) -> np.ndarray:  # pragma: no cover - compiled
    m, n = len(users), items.shape[1]
    ranks = np.full(m, NOT_RANKED, dtype=np.int64)
    marked = np.zeros(n, dtype=np.bool_)
    row = np.empty(n)
    for j in range(m):
        target = targets[j]
        if target < 0:
            continue
        excluded = grouped[starts[j] : starts[j + 1]]
        if (excluded == target).any():
            continue
        _score_row(users[j], items, shift[j], row)
        ranks[j] = _rank_row(row, target, excluded, marked)
    return ranks


@njit(cache=True, nogil=True)
def _score_row(
    user: np.ndarray, items: np.ndarray, shift: float, row: np.ndarray
) -> None:  # pragma: no cover - compiled
    """``row = user @ items + shift``, summed as ``np.einsum`` sums: from zero, one factor
    at a time, each product rounded before it is added (no fused multiply-add)."""
    row[:] = 0.0
    for k in range(items.shape[0]):
        weight = user[k]
        for i in range(row.size):
            row[i] += weight * items[k, i]
    for i in range(row.size):
        row[i] += shift


@njit(cache=True, nogil=True)
def _rank_within(
    users: np.ndarray,
    items: np.ndarray,
    shift: np.ndarray,
    targets: np.ndarray,
    starts: np.ndarray,
    grouped: np.ndarray,
    within: int,
) -> np.ndarray:  # pragma: no cover - compiled
    m, n = len(users), len(items)
    ranks = np.full(m, NOT_RANKED, dtype=np.int64)
    marked = np.zeros(n, dtype=np.bool_)
    for j in range(m):
        target = targets[j]
        if target < 0:
            continue
        excluded = grouped[starts[j] : starts[j + 1]]
        for r in excluded:
            marked[r] = True
        if not marked[target]:
            user, offset = users[j], shift[j]
            chosen = _score_item(user, items[target], offset)
            ahead = 0
            for i in range(n):
                if i == target or marked[i]:
                    continue
                score = _score_item(user, items[i], offset)
                if score > chosen or (score == chosen and i < target):
                    ahead += 1
                    if ahead == within:  # the target is past the list: stop counting
                        break
            ranks[j] = 1 + ahead
        for r in excluded:
            marked[r] = False
    return ranks


@njit(cache=True, nogil=True, inline="always")
def _score_item(user: np.ndarray, item: np.ndarray, shift: float) -> float:  # pragma: no cover
    """``user @ item + shift``, summed as ``_score_row`` sums each item's score."""
    total = 0.0
    for k in range(item.size):
        total += user[k] * item[k]
    return total + shift


def hits(ranks: ArrayLike, k: int = DEFAULT_K) -> np.ndarray:
    """1.0 where the item was in the top ``k`` (rank 1..k), else 0.0, shape ``(m,)``.

    Examples
    --------
    >>> hits([1, 10, 11, 0]).tolist()
    [1.0, 1.0, 0.0, 0.0]
    """
    ranked = np.asarray(ranks, dtype=np.int64).reshape(-1)
    return ((ranked >= 1) & (ranked <= k)).astype(np.float64)


def ndcg(ranks: ArrayLike, k: int = DEFAULT_K) -> np.ndarray:
    """NDCG@k of each event with one relevant item: ``1 / log2(rank + 1)`` within k, else 0.

    The ideal list puts the item first, whose gain ``1 / log2(2)`` is 1, so the
    discounted gain is already normalised.

    Examples
    --------
    >>> ndcg([1, 2, 3, 10, 11, 0]).round(4).tolist()
    [1.0, 0.6309, 0.5, 0.2891, 0.0, 0.0]
    """
    ranked = np.asarray(ranks, dtype=np.float64).reshape(-1)
    inside = hits(ranks, k) > 0
    gains = np.zeros(ranked.size)
    gains[inside] = 1.0 / np.log2(ranked[inside] + 1.0)
    return gains


class RankingTracker:
    """Running hit-rate@k and NDCG@k of several named predictors (tracks) over one stream.

    The ranking counterpart of ``PrequentialTracker``: record each track's ranks of the
    same sampled events and compare the tracks side by side.

    Parameters
    ----------
    k
        Length of the list judged.

    Examples
    --------
    >>> tracker = RankingTracker(k=10)
    >>> tracker.record("driftline", [1, 4, 30, 0])
    >>> tracker.record("static", [12, 2, 0, 0])
    >>> for track, stats in tracker.summary().items():
    ...     print(track, stats["hit_rate"], round(stats["ndcg"], 4), stats["count"])
    driftline 0.5 0.3577 4
    static 0.25 0.1577 4
    """

    def __init__(self, k: int = DEFAULT_K) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.k = k
        self._hits: dict[str, float] = {}
        self._gains: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def record(self, track: str, ranks: ArrayLike) -> None:
        """Add the ranks ``(m,)`` of ``m`` sampled events to ``track`` (``NOT_RANKED``: a miss)."""
        ranked = np.asarray(ranks, dtype=np.int64).reshape(-1)
        inside = (ranked >= 1) & (ranked <= self.k)
        gains = np.zeros(ranked.size)  # ``ndcg``'s array, summed the same way
        gains[inside] = 1.0 / np.log2(ranked[inside] + 1.0)
        self._hits[track] = self._hits.get(track, 0.0) + float(np.count_nonzero(inside))
        self._gains[track] = self._gains.get(track, 0.0) + float(gains.sum())
        self._counts[track] = self._counts.get(track, 0) + int(ranked.size)

    def hit_rate(self, track: str) -> float | None:
        """Share of ``track``'s ranked events whose item made the top k; None before any."""
        count = self._counts.get(track, 0)
        return self._hits[track] / count if count else None

    def ndcg(self, track: str) -> float | None:
        """Mean NDCG@k of ``track``'s ranked events; None before any."""
        count = self._counts.get(track, 0)
        return self._gains[track] / count if count else None

    def count(self, track: str) -> int:
        """Events ranked for ``track``."""
        return self._counts.get(track, 0)

    def tracks(self) -> list[str]:
        """Track names, in the order they were first recorded."""
        return list(self._counts)

    def summary(self) -> dict[str, dict]:
        """``{track: {"hit_rate", "ndcg", "count"}}`` for every track."""
        return {
            track: {
                "hit_rate": self.hit_rate(track),
                "ndcg": self.ndcg(track),
                "count": self.count(track),
            }
            for track in self._counts
        }
