"""The methods ``driftline bench configurator`` compares, each a ``Configurator``.

GP-OPT and its ablations (the analytic model alone, uncalibrated and calibrated; the
same with scikit-learn's GP in place of gpytorch) come from :mod:`configurator.gp`; the
baselines are here: random search, a 3-level grid, the static default, CherryPick-style
BO, and the oracle that knows the truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.special import ndtr

from benchmarks.gpopt.truth import Truth
from configurator.base import Configurator, JobContext, Observation
from configurator.gp import GpOptConfigurator, GpOptSettings
from configurator.history import History
from configurator.performance import epoch_progress
from configurator.space import EpochConfig, SearchSpace
from configurator.static import StaticConfigurator
from configurator.surrogate import GpytorchSurrogate, Surrogate


class SklearnSurrogate:
    """scikit-learn's ``GaussianProcessRegressor`` with the same kernel (Matérn-5/2 ARD
    times a constant, plus white noise), as a :class:`configurator.surrogate.Surrogate`."""

    def __init__(self) -> None:
        self._gp: Any = None
        self._state: dict[str, Any] = {}

    def _kernel(self, d: int) -> Any:
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        ls = self._state.get("lengthscale", [0.5] * d)
        return ConstantKernel(self._state.get("outputscale", 0.25), (1e-4, 10.0)) * Matern(
            ls, (1e-2, 1e2), nu=2.5
        ) + WhiteKernel(self._state.get("noise", 0.05), (1e-5, 1.0))

    def fit(self, x: np.ndarray, y: np.ndarray, *, optimise: bool) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor

        d = x.shape[1]
        if len(self._state.get("lengthscale", [])) != d:
            self._state = {}
        gp = GaussianProcessRegressor(
            self._kernel(d), optimizer="fmin_l_bfgs_b" if optimise and len(x) >= 2 else None
        )
        gp.fit(x, y)
        self._gp = gp
        if optimise:
            params = gp.kernel_.get_params()
            self._state = {
                "lengthscale": list(np.atleast_1d(params["k1__k2__length_scale"]).astype(float)),
                "outputscale": float(params["k1__k1__constant_value"]),
                "noise": float(params["k2__noise_level"]),
            }

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._gp is None:
            return np.zeros(len(x)), np.full(len(x), self._state.get("outputscale", 0.25))
        mean, sd = self._gp.predict(x, return_std=True)
        noise = self._state.get("noise", 0.0)
        return mean, np.maximum(sd**2 - noise, 1e-12)

    def state(self) -> dict[str, Any]:
        return dict(self._state)

    def load_state(self, state: dict[str, Any]) -> None:
        self._state = dict(state)


class RandomConfigurator(Configurator):
    """A uniformly random candidate every epoch."""

    def __init__(self, space: SearchSpace, seed: int) -> None:
        self._grid = space.grid()
        self._rng = np.random.default_rng(seed)

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        return self._grid.config(int(self._rng.integers(len(self._grid))))


def three_levels(levels: tuple[Any, ...]) -> tuple[Any, ...]:
    """Lowest, middle and highest level of a grid."""
    return tuple(sorted({levels[0], levels[len(levels) // 2], levels[-1]}))


class GridConfigurator(Configurator):
    """The 3^5 grid (low, middle, high of each dimension) in a seeded order, then the
    best observed point (lowest cost per progress within its deadline) for good."""

    def __init__(self, space: SearchSpace, seed: int, deadline: Callable[[int], float]) -> None:
        coarse = SearchSpace(*(three_levels(getattr(space, f)) for f in _FIELDS))
        grid = coarse.grid()
        order = np.random.default_rng(seed).permutation(len(grid))
        self._points = [grid.config(int(i)) for i in order]
        self._deadline = deadline

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        if epoch < len(self._points):
            return self._points[epoch]
        return _best_observed(history, self._deadline) or self._points[0]


_FIELDS = ("memory_mb", "workers", "sync_ratio", "batch_size", "learning_rate")


def _best_observed(
    history: Sequence[Observation], deadline: Callable[[int], float]
) -> EpochConfig | None:
    progress = dict(epoch_progress(history))
    best, best_value = None, math.inf
    for t, obs in enumerate(history):
        p = progress.get(t, 0.0)
        if p > 0 and obs.duration_s <= deadline(t) and obs.cost_usd / p < best_value:
            best, best_value = obs.config, obs.cost_usd / p
    return best


class CherryPickConfigurator(Configurator):
    """CherryPick-style BO (Alipourfard et al., NSDI 2017): 3 random probes, then a GP
    (Matérn-5/2) on log cost per progress and one on log latency, picking the largest
    EI × P(latency ≤ deadline) over every candidate. No analytic model, no pruning.
    Hyper-parameters are refitted on the same growing schedule as GP-OPT's."""

    def __init__(
        self, space: SearchSpace, context: JobContext, seed: int, deadline: Callable[[int], float]
    ) -> None:
        self._space = space
        self._grid = space.grid()
        self._features = self._grid.features(space.bounds())
        self._rng = np.random.default_rng(seed)
        self._deadline = deadline
        self._context = context
        self._gps: dict[str, Surrogate] = {
            "objective": GpytorchSurrogate(),
            "latency": GpytorchSurrogate(),
        }
        self._refit_at = 1

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        if epoch < 3:
            return self._grid.config(int(self._rng.integers(len(self._grid))))
        rows = np.array([self._space.index(self._grid, o.config) for o in history])
        progress = dict(epoch_progress(history))
        x = self._features[rows]
        lat = np.log([o.duration_s for o in history])
        optimise = len(history) >= self._refit_at
        if optimise:
            self._refit_at = math.ceil(len(history) * 1.5)
        self._fit("latency", x, lat - lat.mean(), optimise)
        known = np.array([t in progress and progress[t] > 0 for t in range(len(history))])
        obj = np.array(
            [math.log(o.cost_usd / progress[t]) for t, o in enumerate(history) if known[t]]
        )
        if len(obj) < 2:
            return self._grid.config(int(self._rng.integers(len(self._grid))))
        self._fit("objective", x[known], obj - obj.mean(), optimise)
        m_obj, v_obj = self._gps["objective"].predict(self._features)
        m_lat, v_lat = self._gps["latency"].predict(self._features)
        m_obj, m_lat = m_obj + obj.mean(), m_lat + lat.mean()
        sd = np.sqrt(v_obj + 1e-12)
        z = (obj.min() - m_obj) / sd
        ei = sd * (np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) + z * ndtr(z))
        feasible = ndtr((math.log(self._deadline(epoch)) - m_lat) / np.sqrt(v_lat + 1e-12))
        return self._grid.config(int(np.argmax(ei * feasible)))

    def _fit(self, name: str, x: np.ndarray, y: np.ndarray, optimise: bool) -> None:
        self._gps[name].fit(x, y, optimise=optimise)


class OracleConfigurator(Configurator):
    """Exhaustive search of the truth: the lowest true cost per progress among the
    candidates whose true 90th-percentile latency meets the deadline share."""

    def __init__(
        self, space: SearchSpace, truth: Callable[[int], Truth], deadline: Callable[[int], float]
    ) -> None:
        self._grid = space.grid()
        self._truth = truth
        self._deadline = deadline
        self._best: dict[tuple[int, float], int] = {}

    def best_row(self, epoch: int) -> int:
        """The epoch's optimum. An epoch's phase scales every candidate's progress alike,
        so the optimum changes only with the truth (a jump) or the deadline share."""
        truth, deadline = self._truth(epoch), self._deadline(epoch)
        key = (id(truth), deadline)
        if key not in self._best:
            q90 = truth.quantile_latency(self._grid, 0.9)
            objective = truth.objective(self._grid)
            feasible = q90 <= deadline
            best = np.argmin(np.where(feasible, objective, np.inf)) if feasible.any() else None
            self._best[key] = int(np.argmin(q90) if best is None else best)
        return self._best[key]

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        return self._grid.config(self.best_row(epoch))


def gp_opt(
    default: EpochConfig,
    context: JobContext,
    space: SearchSpace,
    history: History | None = None,
    **settings: Any,
) -> GpOptConfigurator:
    """GP-OPT (or an ablation, by ``settings``), deciding in line for reproducibility."""
    surrogate = settings.pop("surrogates", None)
    return GpOptConfigurator(
        default,
        context,
        GpOptSettings(background=False, **settings),
        space,
        history=history,
        surrogates=surrogate,
    )


def static(default: EpochConfig) -> Configurator:
    return StaticConfigurator(default)
