"""The fold-in's arithmetic, event by event, compiled: what ``ServingModel`` runs per batch.

Fold-in is sequential by nature: event j is predicted from every earlier event of its
user and of its item, the earlier events of the same batch included, and then learnt.
Each step is small (a (k+2)x(k+2) ridge solve and two rank-one updates), so in numpy
the per-call overhead would dwarf the arithmetic; compiled, the loop does only the
arithmetic (measured variants: ``docs/decisions/0007``).

A user's events are exactly sequential within a batch; an item's residuals are computed
with each user's vector from before the batch (``start_vectors``), the rule the fold-in
has always had (why it stays: ``docs/decisions/0007``). The per-event
reference in ``tests/service/test_fold_in_equivalence.py`` spells the same rule out.

The kernels take the state arrays (one row per user or item, ``service.serving.rows``)
and update them in place; the caller maps ids to rows, owns the arrays and publishes the
result. Systems are symmetric positive definite (a Gram matrix plus a positive ridge),
so a Cholesky factorisation solves them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Where [p_u; b_u; s_u] keeps the bias and the scale (``service.serving.vector``).
_BIAS, _SCALE = -2, -1


@njit(cache=True, nogil=True)
def _ridge_solve(
    gram: np.ndarray, rhs: np.ndarray, ridge: np.ndarray, prior: np.ndarray, out: np.ndarray
) -> None:  # pragma: no cover - compiled
    """out = (gram + diag(ridge))⁻¹ (rhs + ridge · prior), by Cholesky."""
    d = gram.shape[0]
    lower = np.zeros((d, d))
    for j in range(d):
        total = gram[j, j] + ridge[j]
        for k in range(j):
            total -= lower[j, k] * lower[j, k]
        lower[j, j] = np.sqrt(total)
        for i in range(j + 1, d):
            total = gram[i, j]
            for k in range(j):
                total -= lower[i, k] * lower[j, k]
            lower[i, j] = total / lower[j, j]
    for i in range(d):
        total = rhs[i] + ridge[i] * prior[i]
        for k in range(i):
            total -= lower[i, k] * out[k]
        out[i] = total / lower[i, i]
    for i in range(d - 1, -1, -1):
        total = out[i]
        for k in range(i + 1, d):
            total -= lower[k, i] * out[k]
        out[i] = total / lower[i, i]


@njit(cache=True, nogil=True)
def fold_in_events(
    user_rows: np.ndarray,
    item_rows: np.ndarray,
    factors: np.ndarray,
    ratings: np.ndarray,
    means: np.ndarray,
    start_vectors: np.ndarray,
    gram: np.ndarray,
    rhs: np.ndarray,
    prior: np.ndarray,
    ridge: np.ndarray,
    item_sum: np.ndarray,
    item_count: np.ndarray,
    item_regularization: float,
    forgetting: float,
    low: float,
    high: float,
    predictions: np.ndarray,
    vectors: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Predict then learn each event in order; fills ``predictions`` and ``vectors``.

    Event j, of user u and item i (rows), with the item's factors q (zero for an item
    the version lacks) and the global mean it is predicted with:

    1. b_i = Σ w·residual / (λ_item + Σ w²) over the item's earlier events, forgetting;
    2. [p_u; b_u; s_u] = (G_u + R)⁻¹ (h_u + R · prior_u) from the user's earlier events;
    3. the prediction: clip(mean + [q; 1; b_i] · [p_u; b_u; s_u]) to [low, high];
    4. the item learns its residual r − mean − q·p − b, weighed by s, with [p; b; s]
       the user's vector from before the batch (``start_vectors[j]``);
    5. the user learns: G_u ← f·G_u + x xᵀ, h_u ← f·h_u + x·(r − mean), x = [q; 1; b_i].

    ``vectors[j]`` is the vector of step 2, which prequential ranking scores with.
    """
    dim = gram.shape[1]
    k = dim - 2
    features = np.empty(dim)
    for j in range(len(user_rows)):
        u, i = user_rows[j], item_rows[j]
        item_bias = item_sum[i] / (item_regularization + item_count[i])
        for d in range(k):
            features[d] = factors[j, d]
        features[k] = 1.0
        features[k + 1] = item_bias
        vector = vectors[j]
        _ridge_solve(gram[u], rhs[u], ridge, prior[u], vector)
        target = ratings[j] - means[j]
        score = means[j]
        for d in range(dim):
            score += features[d] * vector[d]
        predictions[j] = min(max(score, low), high)
        start = start_vectors[j]
        residual = target - start[dim + _BIAS]
        for d in range(k):
            residual -= features[d] * start[d]
        weight = start[dim + _SCALE]
        item_sum[i] = forgetting * item_sum[i] + weight * residual
        item_count[i] = forgetting * item_count[i] + weight * weight
        user_gram, user_rhs = gram[u], rhs[u]
        for a in range(dim):
            user_rhs[a] = forgetting * user_rhs[a] + features[a] * target
            for b in range(dim):
                user_gram[a, b] = forgetting * user_gram[a, b] + features[a] * features[b]


@njit(cache=True, nogil=True)
def solve_rows(
    rows: np.ndarray,
    gram: np.ndarray,
    rhs: np.ndarray,
    prior: np.ndarray,
    ridge: np.ndarray,
    vector: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """vector[u] = (G_u + R)⁻¹ (h_u + R · prior_u) for each row u in ``rows``."""
    for u in rows:
        _ridge_solve(gram[u], rhs[u], ridge, prior[u], vector[u])
