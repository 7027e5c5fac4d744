"""Biased matrix factorisation trained by vectorised minibatch SGD.

This is the model the service serves and the retraining workers train. It works on
string ids (MovieLens user and movie ids, product SKUs, ...) that are mapped to dense
rows on first sight, so a streaming service can keep growing the model as new users
and items arrive without retraining from scratch.

The model keeps its arrays and answers predictions; its collaborators each do one job:
``functions.mf_rows`` encodes ids and stores the rows, ``functions.mf_sgd`` takes the
training steps, ``functions.mf_arrays`` writes and checks the plain-array form, and
``functions.topk`` ranks scores.

Only numpy and the standard library are used: the module has to zip into a Lambda
package.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from functions.mf_arrays import (
    ARRAY_FORMAT_VERSION,
    read_global_mean,
    read_params,
    read_side,
    write_arrays,
)
from functions.mf_checks import (
    as_ratings,
    as_rows,
    check_int,
    check_real,
    check_same_length,
    clip_predictions,
)
from functions.mf_rows import DTYPE, UserItemRows
from functions.mf_sgd import Tables, sgd_epoch
from functions.topk import top_k

__all__ = ["ARRAY_FORMAT_VERSION", "DTYPE", "BiasedMF", "top_k"]


class BiasedMF(UserItemRows):
    r"""Biased matrix factorisation, :math:`\hat r_{ui} = \mu + b_u + b_i + p_u \cdot q_i`.

    Users and items are string ids mapped to rows on first sight (:meth:`grow`). The
    model is trained by shuffled minibatch SGD on the squared error with L2
    regularisation (Koren, Bell & Volinsky 2009, Eq. 5), vectorised in numpy, each row
    stepping along the mean of its gradients in a minibatch (:mod:`functions.mf_sgd`).
    With the default penalty 32 factors overfit after several epochs, so a caller
    should judge a model on held-out events.

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

    The id tables and row arrays (``user_ids``, ``user_index``, ``user_bias``,
    ``user_factors`` and the items' likewise) are those of
    :class:`functions.mf_rows.UserItemRows`: writable views into storage that
    :meth:`grow` may reallocate, to be read again after growing.

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
        check_int("factors", factors, minimum=1)
        check_real("learning_rate", learning_rate, positive=True)
        check_real("regularization", regularization, positive=False)
        check_real("init_scale", init_scale, positive=False)
        if seed is not None:
            check_int("seed", seed, minimum=0)
        self.factors = factors
        self.learning_rate = learning_rate
        self.regularization = regularization
        self.init_scale = init_scale
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self.global_mean: float = 0.0
        super().__init__(factors)

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

    # -- rows -----------------------------------------------------------------------

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

    # -- prediction -----------------------------------------------------------------

    def predict_encoded(
        self, u: np.ndarray, i: np.ndarray, clip: tuple[float, float] | None = None
    ) -> np.ndarray:
        """Predicted ratings for encoded (user row, item row) pairs, shape (n,).

        An unknown user (-1) adds neither bias nor factors, nor does an unknown item, so
        a pair of two unknowns predicts the global mean. `clip` = (low, high) bounds the
        predictions to the rating scale.
        """
        u = as_rows("u", u, self.n_users, allow_unknown=True)
        i = as_rows("i", i, self.n_items, allow_unknown=True)
        check_same_length(u=u, i=i)
        pred = np.full(len(u), self.global_mean, dtype=DTYPE)
        ku, ki = u >= 0, i >= 0
        pred[ku] += self.user_bias[u[ku]]
        pred[ki] += self.item_bias[i[ki]]
        both = ku & ki
        ub, ib = u[both], i[both]
        pred[both] += np.einsum("ij,ij->i", self.user_factors[ub], self.item_factors[ib])
        return clip_predictions(pred, clip)

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
        r = as_ratings(ratings)
        pred = self.predict_encoded(u, i)
        check_same_length(u=pred, ratings=r)
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
        u = as_rows("u", u, self.n_users, allow_unknown=False)
        i = as_rows("i", i, self.n_items, allow_unknown=False)
        r = as_ratings(ratings)
        check_same_length(u=u, i=i, ratings=r)
        check_int("batch_size", batch_size, minimum=1)
        if len(r) == 0:
            raise ValueError("fit_epoch needs at least one rating")
        order = (self._rng if rng is None else rng).permutation(len(r))
        tables = Tables(self.user_bias, self.item_bias, self.user_factors, self.item_factors)
        lr, reg = self.learning_rate, self.regularization
        return sgd_epoch(u, i, r, order, batch_size, tables, self.global_mean, lr, reg)

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
        r = as_ratings(ratings)
        if not len(user_ids) == len(item_ids) == len(r):
            raise ValueError(
                "user_ids, item_ids and ratings must have the same length, got "
                f"{len(user_ids)}, {len(item_ids)} and {len(r)}"
            )
        if len(r) == 0:
            raise ValueError("fit needs at least one rating")
        check_int("epochs", epochs, minimum=0)
        if self.n_users == 0 and self.n_items == 0:
            self.global_mean = float(r.mean())
        self.grow(user_ids, item_ids)
        u, i = self.encode_users(user_ids), self.encode_items(item_ids)
        return [self.fit_epoch(u, i, r, batch_size) for _ in range(epochs)]

    # -- serialisation --------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to restore predictions exactly, as plain numpy arrays
        (:mod:`functions.mf_arrays`).

        Ids are unicode arrays (dtype ``<U...``) and hyper-parameters 0-d arrays, so the
        result serialises with ``allow_pickle=False``. ``seed`` None is stored as -1.
        The random generator's state is not stored: it affects future training, not
        predictions.
        """
        return write_arrays(self.get_params(), self.global_mean, self._users, self._items)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> BiasedMF:
        """Rebuild a model written by :meth:`to_arrays`; ValueError if inconsistent."""
        model = cls(**read_params(arrays))
        model.global_mean = read_global_mean(arrays)
        for side, rows in (("user", model._users), ("item", model._items)):
            ids, bias, factors = read_side(arrays, side, model.factors)
            rows.append(ids, factors)
            rows.bias[:] = bias
        return model
