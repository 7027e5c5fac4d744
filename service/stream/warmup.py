"""The learning path's compiled kernels, loaded before the first batch arrives.

The learning path's inner loops are compiled with numba (``docs/decisions/0007``) on
their first call and cached on disk; even from the cache, the first call of each costs a
load, about 230 ms in all, which the first batch a server learns would otherwise pay
(and the requests queued behind it). ``warm_up_learning_path`` drives throwaway copies
of the stages through one tiny batch, so every kernel is loaded (or compiled and cached,
on a fresh install) before a request waits for it. Nothing it touches is shared with the
service.

``start_warm_up`` runs it on a thread of its own, so a server binds its port at once
even where a fresh install compiles for seconds; a batch that arrives meanwhile waits
only for the kernel it needs (numba compiles one function at a time, under its lock).
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from drift.event_confirm import user_balanced_mean
from drift.page_hinkley import PageHinkley
from drift.ranking import RankingSampler
from drift.segments import SegmentBuffer
from functions.mf import BiasedMF
from service.serving.history import RatedItems
from service.serving.model import ServingModel
from service.serving.popular import PopularItems
from service.store.events import NewEvent
from service.stream.ranking import PrequentialRanking

log = logging.getLogger(__name__)

_USERS = ["warm-up-a", "warm-up-b", "warm-up-a", "warm-up-c", "warm-up-b"]
_ITEMS = ["x", "y", "y", "z", "x"]
_RATINGS = np.array([4.0, 2.0, 5.0, 4.5, 3.0])


def warm_up_learning_path(factors: int) -> float:
    """Run each compiled stage once on a scratch batch; returns the seconds it took."""
    began = time.perf_counter()
    model = BiasedMF(factors=factors, seed=0)
    model.fit(_USERS, _ITEMS, _RATINGS, epochs=1)
    serving = ServingModel(model, "warm-up")
    _, vectors = serving.predict_then_learn_vectors(_USERS, _ITEMS, _RATINGS)
    PopularItems(window=3).add(_USERS, _ITEMS)
    events = [
        NewEvent(user, item, float(rating), None, f"warm-up-{k}")
        for k, (user, item, rating) in enumerate(zip(_USERS, _ITEMS, _RATINGS, strict=True))
    ]
    ranking = PrequentialRanking(RankingSampler(fraction=0.9999, min_rating=0.0), RatedItems())
    ranking.rank(events, serving.view, model, vectors, users=_USERS, items=_ITEMS)
    PageHinkley().update_many(np.linspace(0.0, 1.0, 8))
    user_balanced_mean(_RATINGS / 5.0, np.arange(_RATINGS.size, dtype=np.uint16))
    segments = SegmentBuffer()
    segments.record(_USERS, _ITEMS, _RATINGS / 5.0, after=0)
    segments.report(change_events=2)
    return time.perf_counter() - began


def start_warm_up(factors: int) -> threading.Event:
    """``warm_up_learning_path`` on a daemon thread; the event is set once it is done
    (or failed: a warm-up that fails leaves each kernel to load on its first call)."""
    ready = threading.Event()

    def run() -> None:
        try:
            log.info(
                "learning path's compiled kernels ready in %.2f s", warm_up_learning_path(factors)
            )
        except Exception:
            log.exception("could not load the learning path's kernels ahead of the first batch")
        finally:
            ready.set()

    threading.Thread(target=run, name="kernel-warm-up", daemon=True).start()
    return ready
