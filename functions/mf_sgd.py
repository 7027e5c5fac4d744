"""The training step of :class:`functions.mf.BiasedMF`: vectorised minibatch SGD.

Each minibatch computes its errors at once and scatters the gradients into the rows it
touches, so there is no per-event Python loop on the training path.

Within a minibatch a row that occurs *c* times takes one step along the *mean* of its
*c* per-sample gradients (plus the L2 term), so the step does not depend on the batch
size, which the retraining configurator changes between epochs: averaging bounds every
row's step by the learning rate, while rows seen once per batch (most of them) still
get plain per-sample SGD. A row with many samples per batch advances less per epoch
than under per-sample SGD, which is why the model's default rate is larger than the
usual per-sample one. Why not the summed step:
``docs/decisions/0004-serving-index-and-model-choices.md``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Tables", "apply_mean_gradient", "sgd_epoch", "sgd_step"]


class Tables(NamedTuple):
    """The learned arrays a step updates in place."""

    user_bias: np.ndarray
    item_bias: np.ndarray
    user_factors: np.ndarray
    item_factors: np.ndarray


def sgd_epoch(
    u: np.ndarray,
    i: np.ndarray,
    r: np.ndarray,
    order: np.ndarray,
    batch_size: int,
    tables: Tables,
    global_mean: float,
    lr: float,
    reg: float,
) -> float:
    """One pass over the samples in ``order``, ``batch_size`` at a time; the mean
    squared error of the epoch, each minibatch measured just before its update."""
    total = 0.0
    for start in range(0, len(r), batch_size):
        batch = order[start : start + batch_size]
        total += sgd_step(u[batch], i[batch], r[batch], tables, global_mean, lr, reg)
    return total / len(r)


def sgd_step(
    u: np.ndarray,
    i: np.ndarray,
    r: np.ndarray,
    tables: Tables,
    global_mean: float,
    lr: float,
    reg: float,
) -> float:
    """Update on one minibatch; returns its sum of squared errors before the update.

    Both sides are updated from the same pre-update values (a simultaneous step),
    which keeps the result independent of whether users or items go first.
    """
    ub, ib, pu_all, qi_all = tables
    pu, qi = pu_all[u], qi_all[i]
    err = r - (global_mean + ub[u] + ib[i] + np.einsum("ij,ij->i", pu, qi))
    apply_mean_gradient(u, err, err[:, None] * qi, ub, pu_all, lr, reg)
    apply_mean_gradient(i, err, err[:, None] * pu, ib, qi_all, lr, reg)
    return float(err @ err)


def apply_mean_gradient(
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
