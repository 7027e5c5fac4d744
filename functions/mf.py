"""Biased matrix factorisation trained by vectorised minibatch SGD.

This is the model the service serves and the retraining workers train. It works on
string ids (MovieLens user and movie ids, product SKUs, ...) that are mapped to dense
rows on first sight, so a streaming service can keep growing the model as new users
and items arrive without retraining from scratch.

Only numpy and the standard library are used: the module has to zip into a Lambda
package.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

import numpy as np

__all__ = ["BiasedMF", "top_k"]

#: Floating point type of every learned array. float64 keeps round trips and
#: seeded runs bit-exact and is what ``np.bincount`` accumulates in anyway, so float32
#: would add conversions on the hot path for little gain at these batch sizes.
DTYPE = np.float64

#: Version of the layout written by :meth:`BiasedMF.to_arrays`.
ARRAY_FORMAT_VERSION = 1

_MIN_CAPACITY = 16


class _Rows:
    """A growable id → row table with one bias and one factor vector per row.

    Storage is over-allocated and doubled when full, so that adding a few new ids per
    batch costs amortised O(new ids) instead of copying the whole table each time.
    The public views (`bias`, `factors`) cover only the rows in use.
    """

    def __init__(self, factors: int) -> None:
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self._bias = np.zeros(0, dtype=DTYPE)
        self._factors = np.zeros((0, factors), dtype=DTYPE)

    @property
    def size(self) -> int:
        return len(self.ids)

    @property
    def bias(self) -> np.ndarray:
        """Biases of the rows in use, shape (size,); a writable view."""
        return self._bias[: self.size]

    @property
    def factors(self) -> np.ndarray:
        """Factor vectors of the rows in use, shape (size x factors); a writable view."""
        return self._factors[: self.size]

    def new_ids(self, ids: Iterable[str]) -> list[str]:
        """Ids not yet in the table, once each, in order of first appearance."""
        index = self.index
        return [str(x) for x in dict.fromkeys(ids) if x not in index]

    def append(self, ids: list[str], vectors: np.ndarray) -> None:
        """Add rows for `ids` (all new) with zero bias and the given factor rows."""
        start, stop = self.size, self.size + len(ids)
        if stop > len(self._bias):
            self._reserve(max(stop, 2 * len(self._bias), _MIN_CAPACITY))
        self._bias[start:stop] = 0.0
        self._factors[start:stop] = vectors
        self.index.update(zip(ids, range(start, stop), strict=True))
        self.ids.extend(ids)

    def _reserve(self, capacity: int) -> None:
        bias = np.zeros(capacity, dtype=DTYPE)
        factors = np.zeros((capacity, self._factors.shape[1]), dtype=DTYPE)
        bias[: self.size] = self.bias
        factors[: self.size] = self.factors
        self._bias, self._factors = bias, factors

    def encode(self, ids: Sequence[str]) -> np.ndarray:
        """Row index of each id, -1 for ids not in the table; int64, shape (len(ids),).

        ``map`` over ``dict.get`` rather than a generator: 44 against 62 µs for 500
        MovieLens ids, and ingestion encodes dozens of id lists a batch.
        """
        get = self.index.get
        return np.fromiter(map(get, ids, repeat(-1)), dtype=np.int64, count=len(ids))


class BiasedMF:
    r"""Biased matrix factorisation, :math:`\hat r_{ui} = \mu + b_u + b_i + p_u \cdot q_i`.

    Users and items are string ids mapped to rows on first sight (:meth:`grow`). The
    model is trained by shuffled minibatch SGD on the squared error with L2
    regularisation (Koren, Bell & Volinsky 2009, Eq. 5), vectorised in numpy: each
    minibatch computes its errors at once and scatters the gradients into the rows it
    touches, so there is no per-event Python loop on the training path.

    Within a minibatch a row that occurs *c* times takes one step along the *mean* of
    its *c* per-sample gradients (plus the L2 term), so the step does not depend on the
    batch size, which the retraining configurator changes between epochs: averaging
    bounds every row's step by the learning rate, while rows seen once per batch (most
    of them) still get plain per-sample SGD. A row with many samples per batch advances
    less per epoch than under per-sample SGD, which is why the default rate (0.05) is
    larger than the usual per-sample 0.005-0.01. With the default penalty 32 factors
    overfit after several epochs, so a caller should judge a model on held-out events.
    Why not the summed step: ``docs/decisions/0004-serving-index-and-model-choices.md``.

    The global mean :math:`\mu` is the mean rating of the first :meth:`fit` and is then
    held fixed; the biases absorb any later shift.

    Parameters
    ----------
    factors
        Number of latent factors *k* (length of :math:`p_u` and :math:`q_i`).
    learning_rate
        SGD step size applied to each row's averaged minibatch gradient.
    regularization
        L2 penalty on biases and factors (:math:`\lambda` in Koren et al.).
    init_scale
        Standard deviation of the normal distribution new factor rows are drawn from.
        Zero gives a biases-only model (zero factors never receive a gradient).
    seed
        Seed of the model's random generator (factor initialisation, shuffling), so that
        seeded runs reproduce exactly; ``None`` draws fresh entropy.

    Attributes
    ----------
    global_mean : float
        :math:`\mu`.
    user_ids, item_ids : list[str]
        Id of each row, in row order.
    user_index, item_index : dict[str, int]
        Id → row.
    user_bias : np.ndarray
        Shape (n_users,).
    item_bias : np.ndarray
        Shape (n_items,).
    user_factors : np.ndarray
        Shape (n_users x factors).
    item_factors : np.ndarray
        Shape (n_items x factors).

    The array attributes are writable views into storage that :meth:`grow` may
    reallocate: read them again after growing instead of keeping references.

    References
    ----------
    Y. Koren, R. Bell and C. Volinsky, "Matrix Factorization Techniques for Recommender
    Systems", *Computer* 42(8):30-37, 2009. doi:10.1109/MC.2009.263

    Examples
    --------
    >>> model = BiasedMF(factors=4, seed=0)
    >>> losses = model.fit(["ann", "ann", "bob"], ["x", "y", "x"], [5.0, 3.0, 4.0], epochs=30)
    >>> bool(losses[-1] < losses[0])
    True
    >>> model.predict(["ann", "zoe"], ["x", "x"]).shape
    (2,)
    >>> model.predict(["zoe"], ["unseen"])  # unknown user and item: the global mean
    array([4.])
    >>> model.clone().n_users
    0
    """

    def __init__(
        self,
        factors: int = 32,
        learning_rate: float = 0.05,
        regularization: float = 0.02,
        init_scale: float = 0.05,
        seed: int | None = None,
    ) -> None:
        _check_int("factors", factors, minimum=1)
        _check_real("learning_rate", learning_rate, positive=True)
        _check_real("regularization", regularization, positive=False)
        _check_real("init_scale", init_scale, positive=False)
        if seed is not None:
            _check_int("seed", seed, minimum=0)
        self.factors = factors
        self.learning_rate = learning_rate
        self.regularization = regularization
        self.init_scale = init_scale
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self.global_mean: float = 0.0
        self._users = _Rows(factors)
        self._items = _Rows(factors)

    # -- parameters -----------------------------------------------------------------

    def get_params(self) -> dict[str, Any]:
        """The constructor arguments, as given."""
        return {
            "factors": self.factors,
            "learning_rate": self.learning_rate,
            "regularization": self.regularization,
            "init_scale": self.init_scale,
            "seed": self.seed,
        }

    def clone(self) -> BiasedMF:
        """A fresh, untrained model with the same parameters (and so the same seed)."""
        return type(self)(**self.get_params())

    def copy(self) -> BiasedMF:
        """A deep copy, learned state and random generator included (warm starts)."""
        return _copy.deepcopy(self)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # -- state ----------------------------------------------------------------------

    @property
    def n_users(self) -> int:
        return self._users.size

    @property
    def n_items(self) -> int:
        return self._items.size

    @property
    def user_ids(self) -> list[str]:
        return self._users.ids

    @property
    def item_ids(self) -> list[str]:
        return self._items.ids

    @property
    def user_index(self) -> dict[str, int]:
        return self._users.index

    @property
    def item_index(self) -> dict[str, int]:
        return self._items.index

    @property
    def user_bias(self) -> np.ndarray:
        return self._users.bias

    @property
    def item_bias(self) -> np.ndarray:
        return self._items.bias

    @property
    def user_factors(self) -> np.ndarray:
        return self._users.factors

    @property
    def item_factors(self) -> np.ndarray:
        return self._items.factors

    def grow(self, user_ids: Iterable[str], item_ids: Iterable[str]) -> None:
        """Add rows for the ids not known yet; known ids and their rows are untouched.

        New rows get zero bias and factors drawn from N(0, init_scale²) with the model's
        generator (users first, then items, each in order of first appearance), so
        seeded runs stay reproducible. Storage doubles when full, so calling this once
        per incoming batch costs amortised O(new ids).
        """
        for rows, ids in ((self._users, user_ids), (self._items, item_ids)):
            new = rows.new_ids(ids)
            if new:
                vectors = self._rng.normal(0.0, self.init_scale, (len(new), self.factors))
                rows.append(new, vectors)

    def encode_users(self, ids: Sequence[str]) -> np.ndarray:
        """Row of each user id, -1 where unknown; int64, shape (len(ids),)."""
        return self._users.encode(ids)

    def encode_items(self, ids: Sequence[str]) -> np.ndarray:
        """Row of each item id, -1 where unknown; int64, shape (len(ids),)."""
        return self._items.encode(ids)

    # -- prediction -----------------------------------------------------------------

    def predict_encoded(
        self, u: np.ndarray, i: np.ndarray, clip: tuple[float, float] | None = None
    ) -> np.ndarray:
        """Predicted ratings for encoded (user row, item row) pairs, shape (n,).

        An unknown user (-1) adds neither bias nor factors, nor does an unknown item, so
        a pair of two unknowns predicts the global mean. `clip` = (low, high) bounds the
        predictions to the rating scale.
        """
        u = _as_rows("u", u, self.n_users, allow_unknown=True)
        i = _as_rows("i", i, self.n_items, allow_unknown=True)
        _check_same_length(u=u, i=i)
        pred = np.full(len(u), self.global_mean, dtype=DTYPE)
        ku, ki = u >= 0, i >= 0
        pred[ku] += self.user_bias[u[ku]]
        pred[ki] += self.item_bias[i[ki]]
        both = ku & ki
        ub, ib = u[both], i[both]
        pred[both] += np.einsum("ij,ij->i", self.user_factors[ub], self.item_factors[ib])
        return _clip(pred, clip)

    def predict(
        self,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        clip: tuple[float, float] | None = None,
    ) -> np.ndarray:
        """Predicted ratings for (user id, item id) pairs, shape (n,); see `predict_encoded`."""
        return self.predict_encoded(self.encode_users(user_ids), self.encode_items(item_ids), clip)

    def item_scores(self, user_vector: np.ndarray, user_bias: float) -> np.ndarray:
        """Predicted rating of every item for one user, shape (n_items,).

        Takes the user's factor vector (shape (factors,)) and bias rather than an id so
        the server can score a user folded in on the fly, or pass zeros for a cold user.
        """
        p = np.asarray(user_vector, dtype=DTYPE)
        if p.shape != (self.factors,):
            raise ValueError(f"user_vector must have shape ({self.factors},), got {p.shape}")
        return self.global_mean + float(user_bias) + self.item_bias + self.item_factors @ p

    def damp_items(self, item_ids: Sequence[str], support: float) -> None:
        """Shrink the bias and factors of every item in ``item_ids`` by
        ``n / (n + support)``, n its ratings there.

        SGD with an L2 penalty per rating shrinks every item by the same factor whatever
        its support, so an item rated once at 5 stars keeps nearly all of +1.5 and tops
        every user's list, and its factors are as noisy as its one rating: on MovieLens
        (the first 80,000 ratings trained, the next liked items ranked) hit-rate@10 was
        0.006 ranked so, 0.041 with the biases damped at support 20 and 0.046 with the
        factors too, for the same RMSE (the damped item mean of Koren's baseline
        predictor). Items absent from ``item_ids`` keep theirs.
        """
        if support < 0:
            raise ValueError(f"support must not be negative, got {support}")
        if support == 0 or not len(item_ids):
            return
        rows = self.encode_items(item_ids)
        rows = rows[rows >= 0]
        counts = np.bincount(rows, minlength=self.n_items)
        seen = counts > 0
        factor = (counts[seen] / (counts[seen] + support)).astype(DTYPE)
        self.item_bias[seen] *= factor
        self.item_factors[seen] *= factor[:, None]

    def mse_encoded(self, u: np.ndarray, i: np.ndarray, ratings: np.ndarray) -> float:
        """Mean squared error on encoded pairs, without updating anything."""
        r = _as_ratings(ratings)
        pred = self.predict_encoded(u, i)
        _check_same_length(u=pred, ratings=r)
        err = r - pred
        return float(err @ err) / len(r)

    # -- training -------------------------------------------------------------------

    def fit_epoch(
        self,
        u: np.ndarray,
        i: np.ndarray,
        ratings: np.ndarray,
        batch_size: int = 1024,
        rng: np.random.Generator | None = None,
    ) -> float:
        """One pass of shuffled minibatch SGD over encoded samples.

        Parameters
        ----------
        u, i
            User and item rows, int, shape (n,); all known (>= 0): call :meth:`grow`
            first.
        ratings
            Observed ratings, shape (n,).
        batch_size
            Samples per minibatch.
        rng
            Generator for the shuffle; the model's own generator when None.

        Returns
        -------
        float
            Mean squared training error of the epoch, each minibatch measured just
            before its update (the usual running SGD loss, free to compute).
        """
        u = _as_rows("u", u, self.n_users, allow_unknown=False)
        i = _as_rows("i", i, self.n_items, allow_unknown=False)
        r = _as_ratings(ratings)
        _check_same_length(u=u, i=i, ratings=r)
        _check_int("batch_size", batch_size, minimum=1)
        if len(r) == 0:
            raise ValueError("fit_epoch needs at least one rating")
        order = (self._rng if rng is None else rng).permutation(len(r))
        tables = (self.user_bias, self.item_bias, self.user_factors, self.item_factors)
        total = 0.0
        for start in range(0, len(r), batch_size):
            batch = order[start : start + batch_size]
            total += self._sgd_step(u[batch], i[batch], r[batch], *tables)
        return total / len(r)

    def _sgd_step(
        self,
        u: np.ndarray,
        i: np.ndarray,
        r: np.ndarray,
        ub: np.ndarray,
        ib: np.ndarray,
        pu_all: np.ndarray,
        qi_all: np.ndarray,
    ) -> float:
        """Update on one minibatch; returns its sum of squared errors before the update.

        Both sides are updated from the same pre-update values (a simultaneous step),
        which keeps the result independent of whether users or items go first.
        """
        pu, qi = pu_all[u], qi_all[i]
        err = r - (self.global_mean + ub[u] + ib[i] + np.einsum("ij,ij->i", pu, qi))
        lr, reg = self.learning_rate, self.regularization
        _apply_mean_gradient(u, err, err[:, None] * qi, ub, pu_all, lr, reg)
        _apply_mean_gradient(i, err, err[:, None] * pu, ib, qi_all, lr, reg)
        return float(err @ err)

    def fit(
        self,
        user_ids: Sequence[str],
        item_ids: Sequence[str],
        ratings: Sequence[float] | np.ndarray,
        epochs: int = 10,
        batch_size: int = 1024,
    ) -> list[float]:
        """Grow, encode and train for `epochs` passes; returns the loss of each epoch.

        The global mean is set from these ratings only if the model has no rows yet, so
        fitting a warm-started copy keeps its :math:`\\mu` and learned rows.
        """
        r = _as_ratings(ratings)
        if not len(user_ids) == len(item_ids) == len(r):
            raise ValueError(
                "user_ids, item_ids and ratings must have the same length, got "
                f"{len(user_ids)}, {len(item_ids)} and {len(r)}"
            )
        if len(r) == 0:
            raise ValueError("fit needs at least one rating")
        _check_int("epochs", epochs, minimum=0)
        if self.n_users == 0 and self.n_items == 0:
            self.global_mean = float(r.mean())
        self.grow(user_ids, item_ids)
        u, i = self.encode_users(user_ids), self.encode_items(item_ids)
        return [self.fit_epoch(u, i, r, batch_size) for _ in range(epochs)]

    # -- serialisation --------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to restore predictions exactly, as plain numpy arrays.

        Ids are unicode arrays (dtype ``<U...``) and hyper-parameters 0-d arrays, so the
        result serialises with ``allow_pickle=False``. ``seed`` None is stored as -1.
        The random generator's state is not stored: it affects future training, not
        predictions.
        """
        return {
            "format_version": np.array(ARRAY_FORMAT_VERSION, dtype=np.int64),
            "factors": np.array(self.factors, dtype=np.int64),
            "learning_rate": np.array(self.learning_rate, dtype=np.float64),
            "regularization": np.array(self.regularization, dtype=np.float64),
            "init_scale": np.array(self.init_scale, dtype=np.float64),
            "seed": np.array(-1 if self.seed is None else self.seed, dtype=np.int64),
            "global_mean": np.array(self.global_mean, dtype=np.float64),
            "user_ids": np.array(self.user_ids, dtype=str),
            "item_ids": np.array(self.item_ids, dtype=str),
            "user_bias": self.user_bias.copy(),
            "item_bias": self.item_bias.copy(),
            "user_factors": self.user_factors.copy(),
            "item_factors": self.item_factors.copy(),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> BiasedMF:
        """Rebuild a model written by :meth:`to_arrays`; ValueError if inconsistent."""
        version = int(_scalar(arrays, "format_version"))
        if version != ARRAY_FORMAT_VERSION:
            raise ValueError(
                f"unsupported model array format_version {version}; "
                f"this code reads version {ARRAY_FORMAT_VERSION}"
            )
        seed = int(_scalar(arrays, "seed"))
        model = cls(
            factors=int(_scalar(arrays, "factors")),
            learning_rate=float(_scalar(arrays, "learning_rate")),
            regularization=float(_scalar(arrays, "regularization")),
            init_scale=float(_scalar(arrays, "init_scale")),
            seed=None if seed < 0 else seed,
        )
        model.global_mean = float(_scalar(arrays, "global_mean"))
        for side, rows in (("user", model._users), ("item", model._items)):
            ids, bias, factors = _side_arrays(arrays, side, model.factors)
            rows.append(ids, factors)
            rows.bias[:] = bias
        return model


def top_k(
    scores: np.ndarray, k: int, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best-scoring rows, best first, leaving out the rows in `exclude`.

    Uses ``np.argpartition`` (O(n)) and sorts only the `k` selected, which matters when
    scoring every item per request. Ties are broken by the lower row index, so the
    answer is deterministic. Fewer than `k` rows come back when fewer are eligible.
    Scores must not be NaN.

    Parameters
    ----------
    scores
        Score of every row, shape (n,).
    k
        How many rows to return (>= 0).
    exclude
        Row indices to leave out (e.g. items the user has rated); may repeat.

    Returns
    -------
    indices, scores
        Row indices (int64) and their scores, each shape (min(k, eligible),).

    Examples
    --------
    >>> idx, best = top_k(np.array([0.1, 0.9, 0.5, 0.7]), 2, exclude=np.array([1]))
    >>> idx.tolist(), best.tolist()
    ([3, 2], [0.7, 0.5])
    """
    scores = np.asarray(scores)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {scores.shape}")
    _check_int("k", k, minimum=0)
    if exclude is not None and len(exclude):
        keep = np.ones(len(scores), dtype=bool)
        keep[np.asarray(exclude, dtype=np.int64)] = False
        candidates = np.flatnonzero(keep)
    else:
        candidates = np.arange(len(scores))
    pool = scores[candidates]
    k = min(k, len(pool))
    if k == 0:
        return np.zeros(0, dtype=np.int64), pool[:0]
    if k < len(pool):
        # argpartition picks arbitrarily among rows tied with the k-th score; take the
        # strictly better rows and then the lowest-indexed of the tied ones.
        threshold = pool[np.argpartition(-pool, k - 1)[k - 1]]
        better = np.flatnonzero(pool > threshold)
        tied = np.flatnonzero(pool == threshold)[: k - len(better)]
        chosen = np.concatenate([better, tied])
    else:
        chosen = np.arange(len(pool))
    chosen = chosen[np.lexsort((chosen, -pool[chosen]))]
    return candidates[chosen].astype(np.int64, copy=False), pool[chosen]


# -- helpers ------------------------------------------------------------------------


def _apply_mean_gradient(
    rows: np.ndarray,
    err: np.ndarray,
    factor_grad: np.ndarray,
    bias: np.ndarray,
    factors: np.ndarray,
    lr: float,
    reg: float,
) -> None:
    """SGD step for the distinct `rows` of a minibatch on one side (users or items).

    `err` (shape (b,)) is each sample's bias gradient and `factor_grad` (b x k) its
    factor gradient. Samples are grouped by row with ``np.bincount`` (faster than
    ``np.add.at`` on 2-D arrays, and summing repeated rows rather than letting the
    last write win), divided by the row's count, then applied once per distinct row.
    """
    uniq, inv, counts = np.unique(rows, return_inverse=True, return_counts=True)
    n, k = len(uniq), factors.shape[1]
    step = lr / counts
    decay = 1.0 - lr * reg
    # p <- p + lr * (mean_grad - reg * p), written as p * decay + sum_grad * lr / count
    # to keep the number of (n x k) temporaries down.
    b = bias[uniq] * decay
    b += np.bincount(inv, weights=err, minlength=n) * step
    bias[uniq] = b
    flat = ((inv * k)[:, None] + np.arange(k)).ravel()
    summed = np.bincount(flat, weights=factor_grad.ravel(), minlength=n * k)
    grad = summed.reshape(n, k) * step[:, None]
    f = factors[uniq] * decay
    f += grad
    factors[uniq] = f


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _check_real(name: str, value: object, positive: bool) -> None:
    if isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool):
        number = float(value)
        if np.isfinite(number) and (number > 0 if positive else number >= 0):
            return
    bound = "> 0" if positive else ">= 0"
    raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _check_same_length(**arrays: np.ndarray) -> None:
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"arrays must have the same length, got {lengths}")


def _as_rows(name: str, rows: np.ndarray, n_rows: int, allow_unknown: bool) -> np.ndarray:
    """Validate encoded rows: 1-D integers in [0, n_rows), or -1 where allowed."""
    a = np.asarray(rows)
    if a.ndim != 1 or not (a.dtype.kind in "iu" or a.size == 0):
        raise ValueError(f"{name} must be a 1-D integer array, got {a.dtype} {a.shape}")
    a = a.astype(np.int64, copy=False)
    if a.size:
        low = -1 if allow_unknown else 0
        if a.min() < low or a.max() >= n_rows:
            raise ValueError(f"{name} holds rows outside [{low}, {n_rows}); grow() first?")
    return a


def _as_ratings(ratings: Sequence[float] | np.ndarray) -> np.ndarray:
    r = np.asarray(ratings, dtype=DTYPE)
    if r.ndim != 1:
        raise ValueError(f"ratings must be 1-D, got shape {r.shape}")
    if not np.isfinite(r).all():
        raise ValueError("ratings must be finite (no NaN or inf)")
    return r


def _clip(pred: np.ndarray, clip: tuple[float, float] | None) -> np.ndarray:
    if clip is None:
        return pred
    low, high = clip
    if not low <= high:
        raise ValueError(f"clip must be (low, high) with low <= high, got {clip!r}")
    return np.clip(pred, low, high, out=pred)


def _scalar(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"model arrays lack {name!r}")
    a = np.asarray(arrays[name])
    if a.shape != () or a.dtype.kind not in "iuf":
        raise ValueError(f"model array {name!r} must be a numeric scalar, got {a.dtype} {a.shape}")
    return a


def _side_arrays(
    arrays: dict[str, np.ndarray], side: str, factors: int
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Check and return (ids, bias, factors) of the "user" or "item" side."""
    names = (f"{side}_ids", f"{side}_bias", f"{side}_factors")
    missing = [name for name in names if name not in arrays]
    if missing:
        raise ValueError(f"model arrays lack {missing}")
    ids, bias, vectors = (np.asarray(arrays[name]) for name in names)
    n = len(ids)
    if ids.ndim != 1 or (ids.dtype.kind != "U" and n):
        raise ValueError(f"{names[0]} must be a 1-D unicode array, got {ids.dtype} {ids.shape}")
    if bias.shape != (n,) or vectors.shape != (n, factors):
        raise ValueError(
            f"{side} arrays disagree: {n} ids, {names[1]} {bias.shape}, "
            f"{names[2]} {vectors.shape} (factors={factors})"
        )
    if bias.dtype.kind != "f" or vectors.dtype.kind != "f":
        raise ValueError(f"{side} bias and factors must be floating point arrays")
    if not (np.isfinite(bias).all() and np.isfinite(vectors).all()):
        raise ValueError(f"{side} bias or factors hold NaN or inf")
    id_list = ids.tolist()
    if len(set(id_list)) != n:
        raise ValueError(f"{names[0]} holds duplicate ids")
    return id_list, bias, vectors
