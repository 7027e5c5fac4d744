"""Acquisition: log constrained expected improvement, in closed form, per candidate.

For a minimised objective with posterior ``N(μ, σ²)``, an incumbent ``best`` and
independent constraints ``c_j ≤ bound_j`` with posteriors ``N(μ_j, σ_j²)``::

    log CEI = log EI + Σ_j log Φ((bound_j - μ_j) / σ_j)
    EI      = σ · h(z),   z = (best - μ) / σ,   h(z) = φ(z) + z Φ(z)

``log h`` is computed the way S. Ament et al. ("Unexpected improvements to expected
improvement for Bayesian optimization", NeurIPS 2023) do for BoTorch's
``LogConstrainedExpectedImprovement``: directly where it is large, through the scaled
complementary error function where ``EI`` underflows, so that candidates far below the
incumbent still rank by how far. It takes means and variances rather than a model,
which is what lets the configurator score marginals in chunks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import erfcx, log_ndtr, ndtr

_C1 = math.log(2 * math.pi) / 2
_C2 = math.log(math.pi / 2) / 2
_INV_SQRT_EPS = 1.0 / math.sqrt(np.finfo(np.float64).eps)


def log_h(z: np.ndarray) -> np.ndarray:
    """``log(φ(z) + z Φ(z))``, accurate for every ``z`` (Ament et al. 2023, Eq. 9).

    Examples
    --------
    >>> round(float(log_h(np.array([0.0]))[0]), 6) == round(-_C1, 6)
    True
    >>> bool(np.isfinite(log_h(np.array([-1e4]))).all())
    True
    """
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    upper = z > -1
    zu = z[upper]
    out[upper] = np.log(np.exp(-0.5 * zu * zu - _C1) + zu * ndtr(zu))
    lower = ~upper
    zl = z[lower]
    mid = zl > -_INV_SQRT_EPS
    value = np.empty_like(zl)
    zm = zl[mid]
    inner = np.log(erfcx(-zm / math.sqrt(2)) * np.abs(zm)) + _C2
    value[mid] = -0.5 * zm * zm - _C1 + _log1mexp(inner)
    zt = zl[~mid]
    value[~mid] = -0.5 * zt * zt - _C1 - 2 * np.log(np.abs(zt))
    out[lower] = value
    return out


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - exp(x))`` for ``x < 0``, stable on both sides of ``-log 2``."""
    x = np.minimum(x, -1e-300)
    return np.where(x > -math.log(2), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def log_expected_improvement(mean: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """``log EI`` of a minimised objective below ``best``."""
    sd = np.maximum(sd, 1e-12)
    return log_h((best - mean) / sd) + np.log(sd)


def log_feasibility(
    constraints: Sequence[tuple[np.ndarray, np.ndarray, float]],
) -> np.ndarray:
    """``Σ log P(c_j ≤ bound_j)`` over ``(mean, sd, bound)`` triples (one array each)."""
    total: np.ndarray | float = 0.0
    for mean, sd, bound in constraints:
        total = total + log_ndtr((bound - mean) / np.maximum(sd, 1e-12))
    return np.asarray(total)


def log_constrained_ei(
    mean: np.ndarray,
    sd: np.ndarray,
    best: float,
    constraints: Sequence[tuple[np.ndarray, np.ndarray, float]],
) -> np.ndarray:
    """``log CEI``: log expected improvement plus the log probability of feasibility.

    Examples
    --------
    >>> mean, sd = np.array([1.0, 1.0]), np.array([0.5, 0.5])
    >>> latency = (np.array([0.0, 2.0]), np.array([0.1, 0.1]), 1.0)
    >>> scores = log_constrained_ei(mean, sd, best=1.2, constraints=[latency])
    >>> bool(scores[0] > scores[1])
    True
    """
    return log_expected_improvement(mean, sd, best) + log_feasibility(constraints)
