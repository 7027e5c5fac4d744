"""The naive recommendation endpoint ``driftline bench serve`` measures Driftline against.

What an engineer writes in an afternoon: a FastAPI app holding the factor matrices and
each user's rated items in memory, scoring the whole catalogue with numpy per request,
leaving out the rated items from a Python set and answering with FastAPI's default JSON
encoding. It is started as its own process with the same factors and rated items as the
Driftline server it is compared with, so both do the same arithmetic per request.

It lives here, in the benchmark, and never in the product.

Run: ``python -m benchmarks.naive_serving --arrays FILE.npz --port N [--loop asyncio
--http h11]``; the defaults, asyncio and h11, are what ``pip install fastapi uvicorn``
gives.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from fastapi import FastAPI


def save_arrays(
    path: Path,
    *,
    user_ids: list[str],
    item_ids: list[str],
    user_factors: np.ndarray,
    item_factors: np.ndarray,
    item_bias: np.ndarray,
    global_mean: float,
    rated: dict[str, list[str]],
) -> None:
    """Write what the naive server loads: factors (``n_users x k``, ``n_items x k``),
    item biases ``(n_items,)`` and each user's rated items, as flat arrays."""
    owners = [user for user, items in rated.items() for _ in items]
    rated_items = [item for items in rated.values() for item in items]
    np.savez(
        path,
        user_ids=np.array(user_ids, dtype=str),
        item_ids=np.array(item_ids, dtype=str),
        user_factors=user_factors,
        item_factors=item_factors,
        item_bias=item_bias,
        global_mean=np.array(global_mean),
        rated_users=np.array(owners, dtype=str),
        rated_items=np.array(rated_items, dtype=str),
    )


def create_app(arrays: Path) -> FastAPI:
    """The naive app over the arrays ``save_arrays`` wrote."""
    data = np.load(arrays)
    user_ids = data["user_ids"].tolist()
    item_ids = data["item_ids"].tolist()
    user_row = {user: row for row, user in enumerate(user_ids)}
    item_row = {item: row for row, item in enumerate(item_ids)}
    user_factors, item_factors = data["user_factors"], data["item_factors"]
    item_bias, global_mean = data["item_bias"], float(data["global_mean"])
    rated: dict[str, set[int]] = {}
    for user, item in zip(data["rated_users"].tolist(), data["rated_items"].tolist(), strict=True):
        rated.setdefault(user, set()).add(item_row[item])
    app = FastAPI()

    @app.get("/recommend")
    def recommend(user_id: str, k: int = 10) -> dict:
        row = user_row.get(user_id)
        if row is None:
            return {"user_id": user_id, "items": [], "model_version": "naive"}
        scores = global_mean + item_bias + item_factors @ user_factors[row]
        seen = rated.get(user_id, set())
        if seen:
            scores[list(seen)] = -np.inf
        top = np.argpartition(-scores, k)[:k]
        top = top[np.argsort(-scores[top])]
        items = [{"item_id": item_ids[i], "score": float(scores[i])} for i in top]
        return {"user_id": user_id, "items": items, "model_version": "naive"}

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", default="asyncio", help="uvicorn's event loop")
    parser.add_argument("--http", default="h11", help="uvicorn's HTTP parser")
    args = parser.parse_args()
    uvicorn.run(
        create_app(args.arrays),
        host="127.0.0.1",
        port=args.port,
        loop=args.loop,
        http=args.http,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
