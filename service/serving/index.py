"""Where ``/recommend`` finds a user's best items: every item scored, or an ANN index.

Scoring the whole catalogue costs a matrix-vector product and a partition over every
item per request: well under a millisecond for MovieLens, tens of milliseconds for a
million items. Above ``SERVING_ANN_MIN_ITEMS`` items (``SERVING_INDEX=auto``), or always
with ``SERVING_INDEX=ann``, the serving view asks an approximate maximum-inner-product
index for candidates instead and scores only those, exactly, with the current biases.

A user's score of item i is μ + b_u + p_u·q_i + s_u·b_i (``service.serving.vector``), so
the ranking is that of [q_i; b_i]·[p_u; s_u]: the item bias is one more coordinate.
Every item is lifted onto a sphere (Bachrach et al. 2014),
x_i = [q_i; b_i; sqrt(R − |[q_i; b_i]|²)] with R the largest squared norm, and the query
is y = [p_u; s_u; 0], so |x_i − y|² = R + |y|² − 2 [q_i; b_i]·[p_u; s_u] and the nearest
items score highest. faiss's inverted-file index clusters the lifted items into about
√n lists and scans the ``probes`` lists nearest to the query.

Trained factors put most of their variance in a few directions, so the index clusters
and scans the leading principal components (``kept_variance``, in multiples of 8
dimensions, never fewer than 32; narrow catalogues are searched whole) and returns
``RERANKED`` candidates for the view to score exactly. With ``codes="pq4"`` (the
default) the lists hold each searched dimension in 4 bits (``IndexIVFPQFastScan``),
scanned with SIMD look-ups, and the ``RERANKED_QUANTIZED`` best by their codes are
re-scored exactly; catalogues smaller than ``QUANTIZED_MIN_ITEMS`` keep ``flat`` lists,
since the codes need more items than that to train on. Why IVF and not an HNSW graph,
and what each of these choices bought: ``docs/decisions/0004-serving-index-and-model-choices.md``.

The index is built from a version's item factors and the online item biases at the
moment of the swap, on the registry follower's thread, never on a request. Biases keep
moving afterwards: the serving view scores the index's candidates with the current
biases and adds every item whose bias has moved in the user's favour since it was
indexed (``ServingView.risen``, or ``fallen`` for a user whose scale is negative), so
an item pushed up since the swap is never missed for being indexed with its old bias.

References
----------
Y. Bachrach et al., "Speeding up the Xbox recommender system using a Euclidean
transformation for inner-product spaces", RecSys 2014. doi:10.1145/2645710.2645741
H. Jégou, M. Douze and C. Schmid, "Product quantization for nearest neighbor search",
IEEE TPAMI 33(1), 2011 (the inverted file). doi:10.1109/TPAMI.2010.57
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.serving.vector import SCALE

#: Training points per inverted list: faiss warns below 39; more buys little.
_TRAIN_PER_LIST = 64
#: k-means iterations of the inverted file's centroids.
_KMEANS_ITERATIONS = 10
#: Candidates asked of a reduced index, all scored exactly by the serving view: a few
#: exact scores cost far less than the probes recall would otherwise need.
RERANKED = 100
#: Candidates asked of an index whose lists hold 4-bit codes: their order by code is
#: rougher than by floats (on the benchmark's catalogue, 100 of them: recall@10 0.940;
#: 300: 0.973, as the float lists' 100).
RERANKED_QUANTIZED = 300
#: Fewest items whose lists are quantized (see the module).
QUANTIZED_MIN_ITEMS = 4096
#: Bits per searched dimension in quantized lists (faiss's fast scan reads 4).
_CODE_BITS = 4
#: Reduced dimensions come in multiples of this (faiss's SIMD scans read 8 floats).
_DIMENSION_STEP = 8
#: Fewest dimensions a reduced index searches (see the module).
MIN_SEARCHED_DIMENSIONS = 32


@dataclass(frozen=True)
class IndexOptions:
    """How a version's index is built and searched.

    Parameters
    ----------
    kind
        ``exact``, ``ann`` or ``auto`` (``SERVING_INDEX``).
    min_items
        With ``auto``, catalogues of at least this many items get an ANN index.
    probes
        Inverted lists scanned per query: recall against time.
    kept_variance
        Share of the lifted items' variance the searched dimensions keep (1.0: search
        every dimension).
    seed
        Seed of the k-means sample and initialisation, so builds reproduce.
    codes
        What the inverted lists hold of each item: ``pq4`` (4 bits a dimension) or
        ``flat`` (floats); see the module.
    """

    kind: str = "auto"
    min_items: int = 50_000
    probes: int = 32
    kept_variance: float = 0.85
    seed: int = 0
    codes: str = "pq4"

    def __post_init__(self) -> None:
        if self.kind not in (*INDEXES, "auto"):
            raise ValueError(f"unknown index {self.kind!r}; choose from {[*INDEXES, 'auto']}")
        if self.min_items < 1 or self.probes < 1:
            raise ValueError("min_items and probes must be at least 1")
        if not 0.0 < self.kept_variance <= 1.0:
            raise ValueError("kept_variance must be in (0, 1]")
        if self.codes not in LISTS:
            raise ValueError(f"unknown codes {self.codes!r}; choose from {[*LISTS]}")

    def resolve(self, n_items: int) -> str:
        """The index a catalogue of ``n_items`` gets: ``auto`` decided by its size.

        Examples
        --------
        >>> options = IndexOptions(min_items=1000)
        >>> options.resolve(999), options.resolve(1000), IndexOptions("ann").resolve(5)
        ('exact', 'ann', 'ann')
        """
        if self.kind != "auto":
            return self.kind
        return "ann" if n_items >= self.min_items else "exact"


class ItemIndex(ABC):
    """Candidate items for a user vector, from a version's items as they were indexed.

    Parameters
    ----------
    item_factors
        q_i of every item (``n_items x k``), in the version's row order.
    item_bias
        The online bias of every item when the index is built ``(n_items,)``; kept
        as ``indexed_bias``.
    """

    name: str = ""

    def __init__(self, item_factors: np.ndarray, item_bias: np.ndarray) -> None:
        self.n_items, self.factors = item_factors.shape
        self.indexed_bias = np.array(item_bias, dtype=np.float64)
        self.build_seconds = 0.0

    @abstractmethod
    def candidates(self, vector: np.ndarray, n: int) -> np.ndarray:
        """Rows of about the ``n`` best items for [p_u; b_u; s_u] ``(k+2,)``, best first by
        the index's reckoning; an index whose order is rough returns more, for the view
        scores every candidate exactly."""

    def candidates_many(self, vectors: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
        """``candidates`` of each row of ``vectors`` and its count, exactly as asked one by
        one; an index that searches many queries at once for less overrides it."""
        return [self.candidates(vector, n) for vector, n in zip(vectors, counts, strict=True)]


class IvfIndex(ItemIndex):
    """faiss ``IndexIVFFlat`` over the items lifted onto a sphere (see the module).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> factors, bias = rng.normal(size=(2000, 8)), rng.normal(size=2000)
    >>> index = IvfIndex(factors, bias, IndexOptions("ann", probes=45))
    >>> user = np.append(rng.normal(size=8), [0.0, 1.0])  # [p_u; b_u; s_u]
    >>> exact = np.argsort(-(factors @ user[:-2] + bias))[:10]
    >>> len(set(index.candidates(user, 10)) & set(exact)) >= 9
    True
    """

    name = "ann"

    def __init__(
        self, item_factors: np.ndarray, item_bias: np.ndarray, options: IndexOptions
    ) -> None:
        import faiss

        super().__init__(item_factors, item_bias)
        began = time.perf_counter()
        points = np.empty((self.n_items, self.factors + 2), dtype=np.float32)
        points[:, : self.factors] = item_factors
        points[:, self.factors] = item_bias
        norms = np.einsum("ij,ij->i", points[:, :-1], points[:, :-1])
        points[:, -1] = np.sqrt(np.maximum(norms.max() - norms, 0.0))
        lists = max(1, min(self.n_items // _TRAIN_PER_LIST, round(math.sqrt(self.n_items))))
        rng = np.random.default_rng(options.seed)
        sample = min(self.n_items, lists * _TRAIN_PER_LIST)
        training = points[np.sort(rng.choice(self.n_items, sample, replace=False))]
        self.dimensions = searched_dimensions(training, options.kept_variance)
        self._quantizer = faiss.IndexFlatL2(self.dimensions)
        codes = options.codes if self.n_items >= QUANTIZED_MIN_ITEMS else "flat"
        ivf = LISTS[codes](self._quantizer, self.dimensions, lists)
        ivf.cp.niter, ivf.cp.seed = _KMEANS_ITERATIONS, options.seed
        self.codes = codes
        #: Fewest candidates a search returns for the view to score exactly.
        self.reranked = RERANKED_QUANTIZED if codes != "flat" else 0
        if self.dimensions < points.shape[1]:
            self.reranked = max(self.reranked, RERANKED)
        ivf.nprobe = min(options.probes, lists)
        index: faiss.Index = ivf
        if self.dimensions < points.shape[1]:
            self._projection = faiss.PCAMatrix(points.shape[1], self.dimensions)
            index = faiss.IndexPreTransform(self._projection, ivf)
        self._ivf = ivf  # faiss keeps raw pointers: the Python objects must outlive it
        index.train(training)
        index.add(points)
        self._index, self.lists = index, lists
        self.build_seconds = time.perf_counter() - began

    def candidates(self, vector: np.ndarray, n: int) -> np.ndarray:
        return self.candidates_many(vector[np.newaxis], [n])[0]

    def candidates_many(self, vectors: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
        """One search for the queries that want as many candidates (all of them, unless
        someone rated hundreds of items). Not one search of the largest count for all:
        the fast scan's order among the best depends on how many it keeps. A query's
        candidates are those it gets alone, up to rounding where the coarse assignment of
        20 queries or more takes faiss's matrix-product path."""
        _single_threaded_search()
        queries = np.zeros((len(vectors), self.factors + 2), dtype=np.float32)
        queries[:, : self.factors] = vectors[:, : self.factors]
        queries[:, self.factors] = vectors[:, SCALE]
        kept = np.minimum(np.maximum(np.asarray(counts), self.reranked), self.n_items)
        found: dict[int, np.ndarray] = {}
        for n in np.unique(kept).tolist():
            (asking,) = np.nonzero(kept == n)
            _, rows = self._index.search(queries[asking], n)
            for at, row in zip(asking.tolist(), rows, strict=True):
                found[at] = row[row >= 0]
        return [found[at] for at in range(len(vectors))]


def searched_dimensions(points: np.ndarray, kept_variance: float) -> int:
    """Leading principal components that hold ``kept_variance`` of ``points``' variance,
    rounded up to a multiple of 8 and at least ``MIN_SEARCHED_DIMENSIONS``; every
    dimension when that saves none.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> spread = np.concatenate([np.full(8, 10.0), np.full(58, 0.1)])
    >>> points = rng.normal(size=(5000, 66)) * spread
    >>> searched_dimensions(points, 0.9), searched_dimensions(points, 1.0)
    (32, 66)
    >>> searched_dimensions(points[:, :32], 0.5)  # narrow: searched whole
    32
    """
    width = points.shape[1]
    if kept_variance >= 1.0 or width <= MIN_SEARCHED_DIMENSIONS or len(points) <= width:
        return width  # nothing to cut, or too few items to estimate components from
    variances = np.linalg.eigvalsh(np.cov(points, rowvar=False))[::-1]
    kept = np.cumsum(variances) / max(float(variances.sum()), 1e-300)
    needed = int(np.searchsorted(kept, kept_variance)) + 1
    dimensions = max(-(-needed // _DIMENSION_STEP) * _DIMENSION_STEP, MIN_SEARCHED_DIMENSIONS)
    return width if dimensions >= width else dimensions


def _flat_lists(quantizer: Any, dimensions: int, lists: int) -> Any:
    """Inverted lists of the items' floats."""
    import faiss

    return faiss.IndexIVFFlat(quantizer, dimensions, lists)


def _pq4_lists(quantizer: Any, dimensions: int, lists: int) -> Any:
    """Inverted lists of 4-bit codes, one sub-quantizer per dimension (see the module)."""
    import faiss

    return faiss.IndexIVFPQFastScan(quantizer, dimensions, lists, dimensions, _CODE_BITS)


#: What an ``IvfIndex``'s inverted lists hold (``SERVING_ANN_CODES``).
LISTS: dict[str, Callable[[Any, int, int], Any]] = {"flat": _flat_lists, "pq4": _pq4_lists}

_search_threads = threading.local()


def _single_threaded_search() -> None:
    """One OpenMP thread for this thread's searches (once per thread).

    A single query gains nothing from a team of threads, and on a busy machine their
    start-up and spinning cost more than the scan; the setting is per calling thread,
    so a build running on the follower's thread keeps every core.
    """
    if getattr(_search_threads, "set", False):
        return
    import faiss

    faiss.omp_set_num_threads(1)
    _search_threads.set = True


def _exact(
    item_factors: np.ndarray, item_bias: np.ndarray, options: IndexOptions
) -> ItemIndex | None:
    """No index: the view scores every item (the default below ``min_items``)."""
    return None


#: How each ``SERVING_INDEX`` value builds a version's index (None: score every item).
INDEXES: dict[str, Callable[[np.ndarray, np.ndarray, IndexOptions], ItemIndex | None]] = {
    "exact": _exact,
    "ann": IvfIndex,
}


def build_index(
    item_factors: np.ndarray, item_bias: np.ndarray, options: IndexOptions
) -> ItemIndex | None:
    """The index ``options`` asks for over these items, or None to score them all."""
    return INDEXES[options.resolve(len(item_factors))](item_factors, item_bias, options)
