"""A user's serving vector and what it scores.

A user is served by [p_u; b_u; s_u]: the factors, the user's bias and the user's scale
on item biases (the c_u of Koren's timeSVD++), so the score of item i is

    μ + b_u + s_u · b_i + q_i · p_u.

The fold-in (``service.serving.model``) learns the vector, exact and indexed top-K and
prequential ranking score with it; this module is the one place that knows its layout.
"""

from __future__ import annotations

import numpy as np

from functions.mf import BiasedMF

#: Where a user's serving vector [p_u; b_u; s_u] keeps the bias and the scale on item
#: biases; the factors come first (``vector[:BIAS]``).
BIAS, SCALE = -2, -1
#: Coordinates after the factors.
EXTRA = 2


def item_scores(
    item_factors: np.ndarray, item_bias: np.ndarray, global_mean: float, vector: np.ndarray
) -> np.ndarray:
    """μ + b_u + s_u · b_i + q_i · p_u for the items given (rows of ``item_factors``).

    Exact and indexed top-K score through this one function, so their scores agree to
    the last bit.

    >>> item_scores(np.eye(2), np.array([1.0, -1.0]), 3.0, np.array([0.5, 0.0, 0.2, -1.0]))
    array([2.7, 4.2])
    """
    scores = item_factors @ vector[:BIAS]
    scores += global_mean + vector[BIAS]
    scores += vector[SCALE] * item_bias
    return scores


def version_vectors(model: BiasedMF | None, rows: np.ndarray, factors: int = 0) -> np.ndarray:
    """The serving vectors of the version's user ``rows`` before any fold-in,
    [p_u; 0; 1] (n x k+2): the online bias starts at zero, the scale at one. A row of
    -1 (a user the version lacks) gets zero factors; without a version, ``factors``
    says how many there are.

    >>> version_vectors(None, np.array([-1, -1])).tolist()
    [[0.0, 1.0], [0.0, 1.0]]
    """
    k = model.factors if model is not None else factors
    vectors = np.zeros((len(rows), k + EXTRA))
    vectors[:, SCALE] = 1.0
    known = rows >= 0
    if model is not None and known.any():
        vectors[known, :BIAS] = model.user_factors[rows[known]]
    return vectors


def version_vector(model: BiasedMF, row: int) -> np.ndarray:
    """``version_vectors`` of one user row."""
    return version_vectors(model, np.array([row]))[0]
