"""The ladder of models a retraining job can swap in, and their errors on every event.

Training a model per job of every run would take hours, so the models come from a
ladder: the bootstrap model, then every ``step`` events a copy of the rung before
warm-started on those events plus an equal uniform sample of history (a job's window,
as the service forms it). A job whose window ends at event e swaps in the rung of the
last checkpoint at or before e; what differs between policies is when that happens,
which is what a trigger policy decides.

A rung is kept as its arrays (float32), not as a model, and its prequential errors are
computed when a replay or a figure asks for a span of events: a table of every rung's
error on every event would be 240 × n floats, 2.9 GB at WITS' 3 million true arrivals
and 23 GB at Twitter's 24 million, where a rung of Twitter's users is 10 MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numba import njit
from threadpoolctl import threadpool_limits

from functions.mf import BiasedMF

RATING_CLIP = (0.5, 5.0)
#: The service's default ``ITEM_BIAS_SUPPORT``, applied before ranking.
ITEM_BIAS_SUPPORT = 20.0
#: Rows of users ranked at once for hit-rate@10 (keeps the score block in cache).
RANK_BLOCK = 256


@dataclass(frozen=True)
class CodedStream:
    """A rating stream as integer codes, one per distinct id: ``users`` and ``items``
    (int64, n each) and ``ratings`` (float64, n)."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:
        return int(self.ratings.size)


class ErrorTable(Protocol):
    """``table[k, start:stop]``: squared errors of rung k on events start to stop - 1."""

    def __getitem__(self, key: tuple[int, slice]) -> np.ndarray: ...


@dataclass(frozen=True)
class Rung:
    """One checkpoint of the ladder: a model's learned arrays, its rows a prefix of the
    last rung's (users ``n_users x factors``, items ``n_items x factors``)."""

    global_mean: float
    user_bias: np.ndarray
    item_bias: np.ndarray
    user_factors: np.ndarray
    item_factors: np.ndarray

    @classmethod
    def of(cls, model: BiasedMF) -> Rung:
        def kept(values: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(values, dtype=np.float32)

        return cls(
            model.global_mean,
            kept(model.user_bias),
            kept(model.item_bias),
            kept(model.user_factors),
            kept(model.item_factors),
        )

    @property
    def n_users(self) -> int:
        return int(self.user_bias.size)

    @property
    def n_items(self) -> int:
        return int(self.item_bias.size)


@njit(cache=True, nogil=True)
def _squared_errors(
    mean: float,
    user_bias: np.ndarray,
    item_bias: np.ndarray,
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    users: np.ndarray,
    items: np.ndarray,
    ratings: np.ndarray,
    low: float,
    high: float,
) -> np.ndarray:  # pragma: no cover - compiled
    out = np.empty(users.size, dtype=np.float32)
    n_users, n_items = user_bias.size, item_bias.size
    for j in range(users.size):
        u, i = users[j], items[j]
        known_u, known_i = 0 <= u < n_users, 0 <= i < n_items
        pred = mean
        if known_u:
            pred += user_bias[u]
        if known_i:
            pred += item_bias[i]
        if known_u and known_i:
            dot = 0.0
            for f in range(user_factors.shape[1]):
                dot += user_factors[u, f] * item_factors[i, f]
            pred += dot
        pred = min(max(pred, low), high)
        out[j] = (pred - ratings[j]) ** 2
    return out


@dataclass(frozen=True)
class RungErrors:
    """The ladder's :class:`ErrorTable`, each span computed from the rung when asked.
    ``users`` and ``items`` are the last rung's rows (-1: never trained on)."""

    rungs: tuple[Rung, ...]
    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    def __getitem__(self, key: tuple[int, slice]) -> np.ndarray:
        k, span = key
        start, stop, _ = span.indices(self.ratings.size)
        rung = self.rungs[k]
        return _squared_errors(
            rung.global_mean,
            rung.user_bias,
            rung.item_bias,
            rung.user_factors,
            rung.item_factors,
            self.users[start:stop],
            self.items[start:stop],
            self.ratings[start:stop],
            *RATING_CLIP,
        )


@dataclass(frozen=True)
class Ladder:
    """``errors[k, start:stop]``: squared errors of rung k on those events (rung 0: the
    bootstrap model, trained on the first ``bootstrap`` events; rung k ≥ 1 has seen the
    events before ``bootstrap + k · step``)."""

    errors: ErrorTable
    bootstrap: int
    step: int
    #: ``hits[k, j]``: whether rung k ranks the item of sampled liked event
    #: ``hit_events[j]`` in its user's top 10 (only for rungs that can serve it).
    hits: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))
    hit_events: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))

    def rung(self, data_end: int) -> int:
        """The rung a job over the events before ``data_end`` swaps in."""
        return max(0, (data_end - self.bootstrap) // self.step)


class _Rows:
    """Codes → the model's rows, given as the model gives them: in order of first
    appearance in what it is fitted on (``BiasedMF.grow``)."""

    def __init__(self, codes: np.ndarray) -> None:
        self.codes = codes
        self.rows = np.full(int(codes.max()) + 1 if codes.size else 0, -1, dtype=np.int64)
        self.size = 0

    def grow(self, picked: np.ndarray) -> list[str]:
        """Rows for the codes of events ``picked`` not seen yet; their ids, in order."""
        codes = self.codes[picked]
        unseen = codes[self.rows[codes] < 0]
        _, first = np.unique(unseen, return_index=True)
        new = unseen[np.sort(first)]
        self.rows[new] = np.arange(self.size, self.size + new.size)
        self.size += new.size
        return [str(c) for c in new.tolist()]

    def of(self, picked: np.ndarray | slice) -> np.ndarray:
        return self.rows[self.codes[picked]]


def _fit(
    model: BiasedMF,
    users: _Rows,
    items: _Rows,
    ratings: np.ndarray,
    picked: np.ndarray,
    epochs: int,
) -> None:
    """``model.fit`` on the events ``picked`` without building their id lists: the same
    rows in the same order, the same draws."""
    if model.n_users == 0 and model.n_items == 0:
        model.global_mean = float(ratings[picked].mean())
    model.grow(users.grow(picked), items.grow(picked))
    u, i, r = users.of(picked), items.of(picked), ratings[picked]
    for _ in range(epochs):
        model.fit_epoch(u, i, r)


def build_ladder(
    stream: CodedStream,
    *,
    bootstrap: int,
    rungs: int,
    factors: int = 16,
    epochs: int = 3,
    seed: int = 0,
    hit_samples: int = 2_000,
) -> Ladder:
    """Train the ladder over ``stream`` and rank ``hit_samples`` liked events under every
    rung; errors are computed when asked (:class:`RungErrors`)."""
    n = len(stream)
    step = max(1, (n - bootstrap) // rungs)
    rng = np.random.default_rng(seed)
    ratings = np.asarray(stream.ratings, dtype=np.float64)
    users, items = _Rows(stream.users), _Rows(stream.items)
    model = BiasedMF(factors=factors, seed=seed)
    _fit(model, users, items, ratings, np.arange(bootstrap), 2 * epochs)
    models = [Rung.of(model)]
    for start in range(bootstrap, n - step + 1, step):
        history = rng.integers(0, start, size=min(step, start))
        rows = np.r_[np.arange(start, start + step), history]
        _fit(model, users, items, ratings, rows, epochs)
        models.append(Rung.of(model))
    u, i = users.of(slice(None)), items.of(slice(None))
    hit_events = _liked_sample(ratings, bootstrap, hit_samples, seed)
    hits = np.zeros((len(models), hit_events.size), dtype=bool)
    # Small products, many of them: one BLAS thread is several times faster than a
    # team contending for two shared cores.
    with threadpool_limits(1):
        for k, rung in enumerate(models):
            seen = bootstrap + k * step
            servable = hit_events >= seen  # a later rung never serves earlier events
            support = np.bincount(i[:seen], minlength=rung.n_items)[: rung.n_items]
            chosen = hit_events[servable]
            hits[k, servable] = top_k_hits(rung, u[chosen], i[chosen], support)
    return Ladder(RungErrors(tuple(models), u, i, ratings), bootstrap, step, hits, hit_events)


def _liked_sample(ratings: np.ndarray, bootstrap: int, size: int, seed: int) -> np.ndarray:
    """Up to ``size`` events after the bootstrap rated 4 stars or more, in order."""
    liked = np.flatnonzero((ratings >= 4.0) & (np.arange(ratings.size) >= bootstrap))
    rng = np.random.default_rng([seed, 10])  # apart from the ladder's own draws
    return np.sort(rng.choice(liked, size=min(size, liked.size), replace=False))


def top_k_hits(
    model: BiasedMF | Rung,
    users: np.ndarray,
    items: np.ndarray,
    support: np.ndarray,
    k: int = 10,
    item_support: float = ITEM_BIAS_SUPPORT,
) -> np.ndarray:
    """Whether each (user row, item row) pair's item is in the user's top ``k`` by
    predicted rating over the model's items, each item's bias and factors damped by
    n / (n + ``item_support``) with n its ratings so far (``support``), as a served
    version is (``ITEM_BIAS_SUPPORT``): undamped, items rated once at 5 stars fill every
    list. A user the model has not seen gets the items by damped bias alone (the
    service's popular items for an unknown user); an item it has not seen is a miss.
    Rated items are not excluded.
    """
    known = (items >= 0) & (items < model.n_items)
    out = np.zeros(users.size, dtype=bool)
    if not known.any():
        return out
    damp = support / (support + item_support)
    factors = (model.item_factors * damp[:, None]).T.astype(model.item_factors.dtype)
    bias = (model.item_bias * damp).astype(factors.dtype)
    rows, wanted = users[known], items[known]
    vectors = np.where(
        ((rows >= 0) & (rows < model.n_users))[:, None],
        model.user_factors[np.clip(rows, 0, max(model.n_users - 1, 0))],
        0.0,
    ).astype(factors.dtype)
    found = np.zeros(rows.size, dtype=bool)
    for at in range(0, rows.size, RANK_BLOCK):
        block = slice(at, at + RANK_BLOCK)
        scores = vectors[block] @ factors + bias
        target = scores[np.arange(scores.shape[0]), wanted[block]]
        found[block] = (scores > target[:, None]).sum(axis=1) < k
    out[known] = found
    return out
