"""A worker's shard and the arithmetic on it, held where that arithmetic runs.

:func:`functions.handler.run_worker` reads a snapshot and a shard, then asks a trainer
for everything that is per rating: the shard's error before and after training, the
rows it touches, and the minibatch steps over each epoch's order. The numpy trainer
does this on the host; the torch trainer (:mod:`functions.gpu`) moves the shard to its
device once and does all of it there, so a GPU speeds up the whole pass and not only
its steps. What stays on the host is per invocation or per epoch: the snapshot and
shard read, one permutation per epoch (drawn by the worker's generator, so every
trainer trains in the same order), and the delta over the touched rows.

A minibatch step is :func:`functions.mf_sgd.sgd_step`: errors from the parameters
before the step, then every touched row moves by the mean of its samples' gradients.
A mean does not depend on the order of its samples, so a minibatch is not shuffled
again inside; trainers agree to floating-point rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from functions.mf import BiasedMF
from functions.mf_sgd import Tables, sgd_step

__all__ = ["NumpyTrainer", "ShardTrainer", "TrainerFactory"]


class ShardTrainer(Protocol):
    """Training arithmetic on one shard of encoded ratings (see the module docstring)."""

    def mse(self) -> float:
        """Mean squared error of the model on the whole shard, as it stands now."""

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The shard's distinct user rows and item rows, sorted (int64, on the host)."""

    def shuffle(self, order: np.ndarray) -> None:
        """Take the shard's positions in ``order`` for the next :meth:`step` calls."""

    def step(self, start: int, stop: int) -> float:
        """One minibatch update on ``order[start:stop]``; its mean squared error before
        the update."""

    def sync(self) -> None:
        """Make the model's numpy arrays reflect every step taken."""


#: Builds a trainer on ``(model, users, items, ratings)``; the model is updated in place.
TrainerFactory = Callable[[BiasedMF, np.ndarray, np.ndarray, np.ndarray], ShardTrainer]


class NumpyTrainer:
    """The shard on the host, stepped with :func:`functions.mf_sgd.sgd_step`."""

    def __init__(
        self, model: BiasedMF, users: np.ndarray, items: np.ndarray, ratings: np.ndarray
    ) -> None:
        self.model = model
        self.users, self.items = users, items
        self.ratings = np.asarray(ratings, dtype=np.float64)
        self.order = np.arange(len(ratings))

    def mse(self) -> float:
        return self.model.mse_encoded(self.users, self.items, self.ratings)

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        return np.unique(self.users), np.unique(self.items)

    def shuffle(self, order: np.ndarray) -> None:
        self.order = order

    def step(self, start: int, stop: int) -> float:
        batch = self.order[start:stop]
        model = self.model
        tables = Tables(model.user_bias, model.item_bias, model.user_factors, model.item_factors)
        sse = sgd_step(
            self.users[batch],
            self.items[batch],
            self.ratings[batch],
            tables,
            model.global_mean,
            model.learning_rate,
            model.regularization,
        )
        return sse / len(batch)

    def sync(self) -> None:
        return None
