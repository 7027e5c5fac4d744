"""The GPU worker: the same invocation as the numpy worker, its arithmetic in torch.

CUDA when present, the CPU otherwise. The shard goes to the device once; the errors
over it before and after training, its distinct rows and every minibatch step run
there (:mod:`functions.trainers`). Each step is the numpy worker's
(:func:`functions.mf_sgd.sgd_step`): errors from the parameters before the step, then
every touched row moves by the mean of its samples' gradients with L2 decay, users and
items from the same pre-step values. So the delta a GPU worker writes matches the numpy
worker's to floating-point tolerance, and the coordinator can mix both.

This is the one module of ``functions`` that may import torch; it does not go
into the Lambda package's runtime path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from functions.handler import WorkerTask, parse_event, run_worker
from functions.mf import BiasedMF


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchTrainer:
    """A :class:`~functions.trainers.ShardTrainer` whose shard and model live on a torch
    device: the shard's errors, its distinct rows and every step run there; the host
    sends one permutation per epoch and reads the model back once."""

    def __init__(
        self,
        model: BiasedMF,
        users: np.ndarray,
        items: np.ndarray,
        ratings: np.ndarray,
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.device = device or default_device()
        tensor = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=self.device)  # noqa: E731
        self.user_bias = tensor(model.user_bias)
        self.item_bias = tensor(model.item_bias)
        self.user_factors = tensor(model.user_factors)
        self.item_factors = tensor(model.item_factors)
        self.users = tensor(np.asarray(users, dtype=np.int64))
        self.items = tensor(np.asarray(items, dtype=np.int64))
        self.ratings = tensor(np.asarray(ratings, dtype=np.float64)).to(self.user_bias.dtype)
        self.order = torch.arange(len(ratings), device=self.device)

    def _errors(
        self,
        users: torch.Tensor,
        items: torch.Tensor,
        ratings: torch.Tensor,
        pu: torch.Tensor,
        qi: torch.Tensor,
    ) -> torch.Tensor:
        """Rating minus prediction, from the rows' factors ``pu`` and ``qi``."""
        predicted = self.model.global_mean + self.user_bias[users] + self.item_bias[items]
        return ratings - (predicted + (pu * qi).sum(dim=1))

    def mse(self) -> float:
        users, items = self.users, self.items
        pu, qi = self.user_factors[users], self.item_factors[items]
        err = self._errors(users, items, self.ratings, pu, qi)
        return float((err @ err).item()) / len(err)

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            torch.unique(self.users).cpu().numpy().astype(np.int64, copy=False),
            torch.unique(self.items).cpu().numpy().astype(np.int64, copy=False),
        )

    def shuffle(self, order: np.ndarray) -> None:
        self.order = torch.as_tensor(order, device=self.device)

    def step(self, start: int, stop: int) -> float:
        batch = self.order[start:stop]
        users, items = self.users[batch], self.items[batch]
        pu, qi = self.user_factors[users], self.item_factors[items]
        err = self._errors(users, items, self.ratings[batch], pu, qi)
        lr, reg = self.model.learning_rate, self.model.regularization
        _mean_step(users, err, err[:, None] * qi, self.user_bias, self.user_factors, lr, reg)
        _mean_step(items, err, err[:, None] * pu, self.item_bias, self.item_factors, lr, reg)
        return float((err @ err).item()) / len(batch)

    def sync(self) -> None:
        self.model.user_bias[:] = self.user_bias.cpu().numpy()
        self.model.item_bias[:] = self.item_bias.cpu().numpy()
        self.model.user_factors[:] = self.user_factors.cpu().numpy()
        self.model.item_factors[:] = self.item_factors.cpu().numpy()


def _mean_step(
    rows: torch.Tensor,
    err: torch.Tensor,
    factor_grad: torch.Tensor,
    bias: torch.Tensor,
    factors: torch.Tensor,
    lr: float,
    reg: float,
) -> None:
    """Move each distinct row by lr x (mean gradient of its samples - reg x value)."""
    unique, inverse, counts = torch.unique(rows, return_inverse=True, return_counts=True)
    step = lr / counts.to(bias.dtype)
    bias_sum = torch.zeros(len(unique), dtype=bias.dtype, device=bias.device)
    bias_sum.index_add_(0, inverse, err)
    grad_sum = torch.zeros((len(unique), factors.shape[1]), dtype=factors.dtype, device=bias.device)
    grad_sum.index_add_(0, inverse, factor_grad)
    decay = 1.0 - lr * reg
    bias[unique] = bias[unique] * decay + bias_sum * step
    factors[unique] = factors[unique] * decay + grad_sum * step[:, None]


def handler(event: dict, context: Any) -> dict:
    """The GPU worker's entry point: :func:`functions.handler.handler` on torch."""
    task: WorkerTask = parse_event(event)
    return run_worker(task, context=context, trainer=TorchTrainer)[0]
