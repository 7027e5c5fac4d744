"""Residual Gaussian processes: what the analytic model gets wrong, learnt per output.

One GP per output (log latency, log cost, log progress), each on the residual
``observed - analytic prediction``, so that far from the observations the prediction is
the analytic model's (a zero prior mean) and near them it is corrected. Each is a
gpytorch ``ExactGP`` in float64 with a Matérn-5/2 kernel with one lengthscale per input
(ARD) and priors on lengthscales, output scale and noise that keep a fit on a handful
of points from collapsing onto them; identical inputs (a config run again) are averaged
into one point, its noise the observations' over their count.

Hyper-parameters are fitted by maximising the marginal likelihood with its priors
(L-BFGS) — off the decision's path: :class:`GpytorchSurrogate`'s
``fit(..., optimise=False)`` only conditions on the data with the hyper-parameters it
has (one Cholesky of an ``n x n`` matrix), and prediction is the cached closed form::

    mean(x) = k(x, X) α,  var(x) = s² - ‖L⁻¹ k(X, x)‖²,  α = (K + σ²I)⁻¹ y,  LLᵀ = K + σ²I

computed for candidates in chunks of marginals. Scoring a joint posterior instead would
materialise an ``m x m`` covariance (19 GB at 20,000 candidates).

Surrogates join through ``SURROGATES``; anything with ``fit``, ``predict``, ``state``
and ``load_state`` fits (the benchmark swaps in scikit-learn's GP this way).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

#: L-BFGS iterations of a hyper-parameter fit.
FIT_ITERATIONS = 50
#: Candidates scored per chunk: a ``chunk x n`` kernel block, never ``m x m``, and small
#: enough to stay in cache through the kernel's passes (256 x 200 observations: 400 kB).
CHUNK = 256


class Surrogate(Protocol):
    """A regression model with a predictive mean and variance per input row."""

    def fit(self, x: np.ndarray, y: np.ndarray, *, optimise: bool) -> None:
        """Condition on ``n x d`` inputs ``x`` and ``n`` targets ``y``; with ``optimise``
        also refit the hyper-parameters."""

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance (of the latent function, no noise) at ``m x d`` rows."""

    def state(self) -> dict[str, Any]:
        """Hyper-parameters as plain JSON, to start the next job's surrogate from."""

    def load_state(self, state: dict[str, Any]) -> None:
        """Take hyper-parameters from :meth:`state` of an earlier surrogate."""


def average_repeats(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Identical rows of ``x`` merged: ``(unique rows, mean target, count)``."""
    unique, inverse, counts = np.unique(
        np.round(x, 12), axis=0, return_inverse=True, return_counts=True
    )
    sums = np.zeros(len(unique))
    np.add.at(sums, inverse.ravel(), y)
    return unique, sums / counts, counts


def matern52(
    x1: np.ndarray, x2: np.ndarray, lengthscale: np.ndarray, outputscale: float
) -> np.ndarray:
    """The Matérn-5/2 ARD kernel, ``len(x1) x len(x2)`` (gpytorch's, in numpy).

    Written in place on two ``len(x1) x len(x2)`` arrays: scoring 5,000 candidates
    against 200 observations is a million entries per output, and a temporary per
    operation would cost more than the arithmetic.

    >>> x = np.array([[0.0, 0.0], [1.0, 0.0]])
    >>> matern52(x, x, np.array([1.0, 1.0]), 2.0).round(4).tolist()
    [[2.0, 1.048], [1.048, 2.0]]
    """
    a, b = x1 / lengthscale, x2 / lengthscale
    sq = a @ b.T
    sq *= -2.0
    sq += (a * a).sum(1)[:, None]
    sq += (b * b).sum(1)[None, :]
    np.maximum(sq, 1e-30, out=sq)
    s5 = np.sqrt(sq)
    s5 *= math.sqrt(5.0)
    kernel = sq  # (1 + √5 r + 5/3 r²) · exp(−√5 r) · outputscale, reusing r²'s array
    kernel *= 5.0 / 3.0
    kernel += 1.0
    kernel += s5
    np.negative(s5, out=s5)
    np.exp(s5, out=s5)
    kernel *= s5
    kernel *= outputscale
    return kernel


def warm_up() -> None:
    """Import torch and gpytorch and run one small hyper-parameter fit.

    Both import lazily, and a fit's first run loads more of them (priors, the marginal
    likelihood, L-BFGS, autograd). Paid by a job's first refit, that is seconds of
    interpreter while the job's epochs run and the service serves; a configurator
    process pays it once, when it starts, ahead of any job.
    """
    rng = np.random.default_rng(0)
    x = rng.random((8, 2))
    GpytorchSurrogate().fit(x, np.sin(3 * x).sum(1), optimise=True)


class GpytorchSurrogate:
    """A residual GP: gpytorch ``ExactGP``, Matérn-5/2 ARD, float64, with priors.

    Parameters
    ----------
    lengthscale_prior
        Gamma ``(concentration, rate)`` of every lengthscale; inputs are scaled to about
        [0, 1], so the default's mean of 0.5 says "a config half the range away is a
        different config".
    outputscale_prior
        Gamma of the kernel's variance: the default's mean 0.04 (sd 0.2 in logs, 20 %)
        is how wrong the recalibrated analytic model is expected to be.
    noise_prior
        Gamma of the noise variance (in logs): mean 0.05.
    """

    def __init__(
        self,
        lengthscale_prior: tuple[float, float] = (3.0, 6.0),
        outputscale_prior: tuple[float, float] = (2.0, 50.0),
        noise_prior: tuple[float, float] = (1.5, 30.0),
    ) -> None:
        self.lengthscale_prior = lengthscale_prior
        self.outputscale_prior = outputscale_prior
        self.noise_prior = noise_prior
        self._state: dict[str, Any] | None = None
        self._x: np.ndarray = np.zeros((0, 0))
        self._alpha: np.ndarray = np.zeros(0)
        self._chol: np.ndarray = np.zeros((0, 0))
        self._chol_inverse: np.ndarray = np.zeros((0, 0))

    # -- hyper-parameters -------------------------------------------------------------
    def _default_state(self, d: int) -> dict[str, Any]:
        (lc, lr), (oc, orate), (nc, nr) = (
            self.lengthscale_prior,
            self.outputscale_prior,
            self.noise_prior,
        )
        return {
            "lengthscale": [lc / lr] * d,
            "outputscale": oc / orate,
            "noise": nc / nr,
        }

    def state(self) -> dict[str, Any]:
        return dict(self._state) if self._state else {}

    def load_state(self, state: dict[str, Any]) -> None:
        if state and {"lengthscale", "outputscale", "noise"} <= set(state):
            self._state = {
                "lengthscale": [float(v) for v in state["lengthscale"]],
                "outputscale": float(state["outputscale"]),
                "noise": float(state["noise"]),
            }

    def build_model(self, x: np.ndarray, y: np.ndarray) -> Any:
        """The gpytorch model on ``x, y`` with the current hyper-parameters (float64)."""
        import gpytorch
        import torch
        from gpytorch.priors import GammaPrior

        d = x.shape[1]
        state = self._state if self._state and len(self._state["lengthscale"]) == d else None
        state = state or self._default_state(d)
        tx = torch.as_tensor(x, dtype=torch.float64)
        ty = torch.as_tensor(y, dtype=torch.float64)
        likelihood = gpytorch.likelihoods.GaussianLikelihood(
            noise_prior=GammaPrior(*self.noise_prior),
            noise_constraint=gpytorch.constraints.GreaterThan(1e-5),
        ).double()
        model = _ResidualGP(tx, ty, likelihood, d, self).double()
        model.covar_module.base_kernel.lengthscale = torch.tensor(
            state["lengthscale"], dtype=torch.float64
        )
        model.covar_module.outputscale = torch.tensor(state["outputscale"], dtype=torch.float64)
        likelihood.noise = torch.tensor([state["noise"]], dtype=torch.float64)
        return model

    def _optimise(self, x: np.ndarray, y: np.ndarray) -> None:
        """Maximise the marginal likelihood (with the priors) by L-BFGS from the current
        hyper-parameters."""
        import gpytorch
        import torch

        model = self.build_model(x, y)
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        optimiser = torch.optim.LBFGS(
            model.parameters(), lr=0.5, max_iter=FIT_ITERATIONS, line_search_fn="strong_wolfe"
        )
        tx, ty = model.train_inputs[0], model.train_targets

        def closure() -> Any:
            optimiser.zero_grad()
            loss = -mll(model(tx), ty)
            loss.backward()
            return loss

        try:
            optimiser.step(closure)
        except Exception as exc:  # a failed fit keeps the hyper-parameters it had
            log.warning("residual GP: hyper-parameter fit failed, kept the old ones: %s", exc)
            return
        kernel = model.covar_module
        fitted = {
            "lengthscale": kernel.base_kernel.lengthscale.detach().reshape(-1).tolist(),
            "outputscale": float(kernel.outputscale.detach()),
            "noise": float(model.likelihood.noise.detach().reshape(-1)[0]),
        }
        values = [*fitted["lengthscale"], fitted["outputscale"], fitted["noise"]]
        if all(math.isfinite(v) and v > 0 for v in values):
            self._state = fitted

    # -- data -------------------------------------------------------------------------
    def fit(self, x: np.ndarray, y: np.ndarray, *, optimise: bool) -> None:
        """Hyper-parameters are fitted on every observation (a config's repeats are
        what tell its noise from its signal); the posterior is conditioned on each
        config's mean, whose noise is the observations' over their count.

        Averaged into one point with the noise of one, a config run ten times would be
        as uncertain as one run once, and the GP would blur real differences between
        configs (``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``).
        """
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        ux, uy, counts = average_repeats(x, y)
        if self._state is None or len(self._state["lengthscale"]) != ux.shape[1]:
            self._state = self._default_state(ux.shape[1])
        if optimise and len(ux) >= 2:
            self._optimise(x, y)
        self._condition(ux, uy, counts)

    def _condition(self, x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> None:
        assert self._state is not None
        ls = np.asarray(self._state["lengthscale"])
        k = matern52(x, x, ls, self._state["outputscale"])
        k[np.diag_indices_from(k)] += self._state["noise"] / counts
        jitter = 1e-10
        while True:
            try:
                chol = np.linalg.cholesky(k + jitter * np.eye(len(k)))
                break
            except np.linalg.LinAlgError:
                jitter *= 10
        self._x, self._chol = x, chol
        self._alpha = _cho_solve(chol, y)
        # L⁻¹ once per conditioning: each prediction's variance is then a triangular
        # matrix product (BLAS trmm, half a full product's work) rather than a
        # triangular solve against every candidate. Column-major, as BLAS takes it.
        self._chol_inverse = _lower_inverse(chol)

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = len(x)
        if not len(self._x) or self._state is None:
            scale = self._state["outputscale"] if self._state else 0.0
            return np.zeros(m), np.full(m, scale)
        ls = np.asarray(self._state["lengthscale"])
        s2 = self._state["outputscale"]
        mean, var = np.empty(m), np.empty(m)
        for start in range(0, m, CHUNK):
            block = matern52(x[start : start + CHUNK], self._x, ls, s2)
            mean[start : start + CHUNK] = block @ self._alpha
            v = _lower_times(self._chol_inverse, block.T)  # columns: L⁻¹ k(X, x)
            var[start : start + CHUNK] = np.maximum(s2 - np.einsum("ij,ij->j", v, v), 1e-12)
        return mean, var


def _lower_inverse(lower: np.ndarray) -> np.ndarray:
    """``lower⁻¹``, column-major (LAPACK trtri: half the work of solving against the
    identity, a millisecond per output of a decision with 200 observations). Only its
    lower triangle is meaningful; :func:`_lower_times` reads no other."""
    from scipy.linalg import lapack

    inverse, info = lapack.dtrtri(lower, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"triangular inverse failed (info {info})")
    return np.asfortranarray(inverse)


def _lower_times(lower: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``lower @ b`` for a lower-triangular, column-major ``lower``."""
    from scipy.linalg import blas

    return np.asarray(blas.dtrmm(1.0, lower, b, side=0, lower=1))


def _cho_solve(chol: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.linalg import cho_solve

    return cho_solve((chol, True), y, check_finite=False)


def _residual_gp_class() -> type:
    """The ExactGP subclass, built on first use so importing this module stays cheap."""
    import gpytorch
    from gpytorch.priors import GammaPrior

    class ResidualGP(gpytorch.models.ExactGP):
        def __init__(self, x: Any, y: Any, likelihood: Any, d: int, owner: GpytorchSurrogate):
            super().__init__(x, y, likelihood)
            self.mean_module = gpytorch.means.ZeroMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.MaternKernel(
                    nu=2.5,
                    ard_num_dims=d,
                    lengthscale_prior=GammaPrior(*owner.lengthscale_prior),
                ),
                outputscale_prior=GammaPrior(*owner.outputscale_prior),
            )

        def forward(self, x: Any) -> Any:
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(x), self.covar_module(x)
            )

    return ResidualGP


_CLASS: type | None = None


def _ResidualGP(*args: Any) -> Any:  # noqa: N802 - stands for the class it builds
    global _CLASS
    if _CLASS is None:
        _CLASS = _residual_gp_class()
    return _CLASS(*args)


#: Surrogates by name; each builds a fresh, unfitted one.
SURROGATES: dict[str, Callable[[], Surrogate]] = {"gpytorch": GpytorchSurrogate}
