"""The GPU worker: the same update as the numpy worker, computed with torch.

CUDA when present, the CPU otherwise. Each minibatch step is the model's own
(:meth:`functions.mf.BiasedMF.fit_epoch` on one minibatch): errors from the parameters
before the step, then every touched row moves by the mean of its samples' gradients
with L2 decay, users and items from the same pre-step values. So the delta a GPU worker
writes matches the numpy worker's to floating-point tolerance, and the coordinator can
mix both. This is the one module of ``functions`` that may import torch; it does not go
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


class TorchStepper:
    """Minibatch SGD on torch tensors of a :class:`BiasedMF` (shapes as the model's)."""

    def __init__(
        self, model: BiasedMF, rng: np.random.Generator, device: torch.device | None = None
    ) -> None:
        self.model = model
        self.rng = rng
        self.device = device or default_device()
        tensor = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=self.device)  # noqa: E731
        self.user_bias = tensor(model.user_bias)
        self.item_bias = tensor(model.item_bias)
        self.user_factors = tensor(model.user_factors)
        self.item_factors = tensor(model.item_factors)

    def step(self, u: np.ndarray, i: np.ndarray, r: np.ndarray) -> float:
        order = self.rng.permutation(len(r))  # the numpy step draws the same permutation
        users = torch.as_tensor(u[order], device=self.device)
        items = torch.as_tensor(i[order], device=self.device)
        ratings = torch.as_tensor(r[order], dtype=self.user_bias.dtype, device=self.device)
        pu, qi = self.user_factors[users], self.item_factors[items]
        predicted = self.model.global_mean + self.user_bias[users] + self.item_bias[items]
        err = ratings - (predicted + (pu * qi).sum(dim=1))
        lr, reg = self.model.learning_rate, self.model.regularization
        _mean_step(users, err, err[:, None] * qi, self.user_bias, self.user_factors, lr, reg)
        _mean_step(items, err, err[:, None] * pu, self.item_bias, self.item_factors, lr, reg)
        return float((err @ err).item()) / len(r)

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
    return run_worker(task, context=context, stepper=TorchStepper)[0]
