"""Folding workers' updates into the model: fresh ones averaged, stale ones (stragglers
of earlier epochs) damped by their staleness, and ASP's updates scaled per row.

References: SandPiper (Ali et al.), §III-B, Eq. 2; W. Zhang, S. Gupta, X. Lian, J. Liu,
"Staleness-aware async-SGD for distributed deep learning" (IJCAI 2016).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from functions.mf import BiasedMF
from functions.shards import apply_delta, average_deltas
from retrain.invocations import Running
from retrain.stats import UsedUpdate


def fold_updates(
    model: BiasedMF,
    updates: list[Running],
    epoch: int,
    weight: float,
    used: list[UsedUpdate],
    moved: Callable[[], None],
) -> None:
    """Fold arrived updates into ``model`` in epoch ``epoch``: the fresh ones averaged
    (Eq. 2), then the stale ones, averaged by staleness τ and damped to
    ``weight / (1 + τ)``; each is appended to ``used``, and ``moved`` is called after
    every step the model takes.

    Damping by staleness follows the staleness-aware rule of Zhang et al. (2016): an
    update computed τ epochs ago gets a step shrunk in proportion. Applied as its own
    step after the fresh average, rather than averaged with it, a straggler's update
    adds its shard's progress instead of diluting the fresh ones'.
    """
    by_staleness: dict[int, list[Running]] = {}
    for r in updates:
        if r.delta is not None:
            by_staleness.setdefault(epoch - r.epoch, []).append(r)
    for staleness, group in sorted(by_staleness.items()):
        group.sort(key=lambda r: (r.epoch, r.worker))  # the same sum whatever the order
        damped = weight / (1 + staleness)
        deltas = [r.delta for r in group if r.delta is not None]
        apply_delta(model, average_deltas(deltas), weight=damped)
        moved()
        for r in group:
            record = r.future.result()
            used.append(
                UsedUpdate(
                    r.worker,
                    r.epoch,
                    epoch,
                    record.duration_s,
                    record.cold_start,
                    record.cost_usd,
                    damped,
                    record.request_id,
                )
            )


class RowShares:
    """Per user and item row, 1 / (number of shards holding it), for one split of the
    data at a time.

    ASP scales each row of an update by its share, so that the λ updates of an epoch
    add up to one averaged step per row, as BSP's average does.
    """

    def __init__(self) -> None:
        self._shares: dict[str, np.ndarray] = {}
        self._for = 0

    def reset(self) -> None:
        """Forget the shares: the data changed."""
        self._for = 0

    def shares(
        self, workers: int, model: BiasedMF, users: np.ndarray, items: np.ndarray, order: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The shares of ``workers`` shards of ``order`` (computed once per count)."""
        if self._for != workers:
            shard_of = np.empty(len(order), dtype=np.int64)
            for worker, rows in enumerate(np.array_split(order, workers)):
                shard_of[rows] = worker
            self._shares = {}
            for side, codes, size in (
                ("user", users, model.n_users),
                ("item", items, model.n_items),
            ):
                pairs = np.unique(codes * workers + shard_of)  # distinct (row, shard)
                holding = np.bincount(pairs // workers, minlength=size)
                self._shares[side] = 1.0 / np.maximum(holding, 1)
            self._for = workers
        return self._shares


def scale_rows(delta: dict[str, np.ndarray] | None, shares: dict[str, np.ndarray]) -> None:
    """Scale each row of `delta` by its side's share, in place."""
    if delta is None:
        return
    for side, share in shares.items():
        weights = share[delta[f"{side}_rows"]]
        delta[f"{side}_bias"] = delta[f"{side}_bias"] * weights
        delta[f"{side}_factors"] = delta[f"{side}_factors"] * weights[:, None]
