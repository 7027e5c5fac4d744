"""The plain-array form of :class:`functions.mf.BiasedMF`: what artifacts and shards store.

Ids are unicode arrays and hyper-parameters 0-d arrays, so the arrays serialise with
``allow_pickle=False``; reading them back checks every array, since they come from
object storage.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from functions.mf_rows import IdRows

__all__ = [
    "ARRAY_FORMAT_VERSION",
    "read_global_mean",
    "read_params",
    "read_side",
    "write_arrays",
]

#: Version of the layout written by :func:`write_arrays`.
ARRAY_FORMAT_VERSION = 1


def write_arrays(
    params: dict[str, Any], global_mean: float, users: IdRows, items: IdRows
) -> dict[str, np.ndarray]:
    """The model's constructor arguments, global mean and rows as numpy arrays (copies).

    ``seed`` None is stored as -1.
    """
    seed = params["seed"]
    return {
        "format_version": np.array(ARRAY_FORMAT_VERSION, dtype=np.int64),
        "factors": np.array(params["factors"], dtype=np.int64),
        "learning_rate": np.array(params["learning_rate"], dtype=np.float64),
        "regularization": np.array(params["regularization"], dtype=np.float64),
        "init_scale": np.array(params["init_scale"], dtype=np.float64),
        "seed": np.array(-1 if seed is None else seed, dtype=np.int64),
        "global_mean": np.array(global_mean, dtype=np.float64),
        "user_ids": np.array(users.ids, dtype=str),
        "item_ids": np.array(items.ids, dtype=str),
        "user_bias": users.bias.copy(),
        "item_bias": items.bias.copy(),
        "user_factors": users.factors.copy(),
        "item_factors": items.factors.copy(),
    }


def read_params(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The constructor arguments stored by :func:`write_arrays`; ValueError for another
    format version or a missing or non-scalar entry."""
    version = int(_scalar(arrays, "format_version"))
    if version != ARRAY_FORMAT_VERSION:
        raise ValueError(
            f"unsupported model array format_version {version}; "
            f"this code reads version {ARRAY_FORMAT_VERSION}"
        )
    seed = int(_scalar(arrays, "seed"))
    return {
        "factors": int(_scalar(arrays, "factors")),
        "learning_rate": float(_scalar(arrays, "learning_rate")),
        "regularization": float(_scalar(arrays, "regularization")),
        "init_scale": float(_scalar(arrays, "init_scale")),
        "seed": None if seed < 0 else seed,
    }


def read_global_mean(arrays: dict[str, np.ndarray]) -> float:
    return float(_scalar(arrays, "global_mean"))


def read_side(
    arrays: dict[str, np.ndarray], side: str, factors: int
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Check and return (ids, bias, factors) of the "user" or "item" side."""
    names = (f"{side}_ids", f"{side}_bias", f"{side}_factors")
    missing = [name for name in names if name not in arrays]
    if missing:
        raise ValueError(f"model arrays lack {missing}")
    ids, bias, vectors = (np.asarray(arrays[name]) for name in names)
    n = len(ids)
    if ids.ndim != 1 or (ids.dtype.kind != "U" and n):
        raise ValueError(f"{names[0]} must be a 1-D unicode array, got {ids.dtype} {ids.shape}")
    if bias.shape != (n,) or vectors.shape != (n, factors):
        raise ValueError(
            f"{side} arrays disagree: {n} ids, {names[1]} {bias.shape}, "
            f"{names[2]} {vectors.shape} (factors={factors})"
        )
    if bias.dtype.kind != "f" or vectors.dtype.kind != "f":
        raise ValueError(f"{side} bias and factors must be floating point arrays")
    if not (np.isfinite(bias).all() and np.isfinite(vectors).all()):
        raise ValueError(f"{side} bias or factors hold NaN or inf")
    id_list = ids.tolist()
    if len(set(id_list)) != n:
        raise ValueError(f"{names[0]} holds duplicate ids")
    return id_list, bias, vectors


def _scalar(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"model arrays lack {name!r}")
    a = np.asarray(arrays[name])
    if a.shape != () or a.dtype.kind not in "iuf":
        raise ValueError(f"model array {name!r} must be a numeric scalar, got {a.dtype} {a.shape}")
    return a
