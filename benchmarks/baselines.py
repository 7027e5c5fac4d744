"""What Driftline is measured against: river's ``BiasedMF`` learning every event.

It is what a team would build instead of Driftline: one online model updated per event,
no drift handling, no versions. Used by the demo and the benchmark on the same stream.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from river import optim, reco


def river_biased_mf(seed: int = 42) -> reco.BiasedMF:
    """river's documented MovieLens configuration of ``reco.BiasedMF``."""
    return reco.BiasedMF(
        n_factors=10,
        bias_optimizer=optim.SGD(0.025),
        latent_optimizer=optim.SGD(0.05),
        latent_initializer=optim.initializers.Normal(mu=0.0, sigma=0.1, seed=seed),
        l2_bias=0.0,
        l2_latent=0.0,
    )


class RiverTrack:
    """Prequential river baseline: predict each event, then learn it."""

    def __init__(self, clip: tuple[float, float] = (0.5, 5.0), seed: int = 42) -> None:
        self.model = river_biased_mf(seed)
        self.clip = clip
        self.seconds = 0.0
        self.count = 0
        self._squared_error = 0.0

    def process(
        self, users: Sequence[str], items: Sequence[str], ratings: Sequence[float]
    ) -> np.ndarray:
        """Predictions made before learning each event; updates the running RMSE."""
        started = time.perf_counter()
        predictions = np.empty(len(users))
        low, high = self.clip
        model = self.model
        for position, (user, item, rating) in enumerate(zip(users, items, ratings, strict=True)):
            predictions[position] = min(high, max(low, model.predict_one(user, item)))
            model.learn_one(user, item, float(rating))
        self.seconds += time.perf_counter() - started
        self.count += len(users)
        self._squared_error += float(np.sum((np.asarray(ratings) - predictions) ** 2))
        return predictions

    @property
    def rmse(self) -> float | None:
        return float(np.sqrt(self._squared_error / self.count)) if self.count else None

    @property
    def events_per_s(self) -> float | None:
        return self.count / self.seconds if self.seconds else None
