"""Index-searching recommendations answered on one thread, many requests at a time.

faiss releases the interpreter while it searches, so a search on a thread of its own
lets the event loop parse and answer other requests on the second core meanwhile
(``service.api.fastpath``). Handing each request over on its own cost nearly as much
as the search: a future, a wake-up of the thread, and a wake-up of the loop through
its self-pipe per request. Here requests queue while the thread is busy, and the
thread takes every waiting one at once: one ``Recommender.recommend_many`` (one faiss
search for all of them, which costs about half as much per query as one each) and
one wake-up of the loop per batch. Under load the batches grow by themselves; a lone
request is searched alone, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass

from service.serving.recommender import Recommendation, Recommender

#: Most requests one search takes; 32 connections never queue more.
MOST_PER_BATCH = 64


@dataclass(frozen=True)
class _Waiting:
    recommender: Recommender
    user_id: str
    k: int
    future: asyncio.Future[Recommendation]
    loop: asyncio.AbstractEventLoop


class RecommendBatcher:
    """The queue of requests waiting for the search thread, and that thread.

    The queue is the only state shared with the loop; the condition guards it. The
    thread starts with the first request and runs as long as the process: it holds
    nothing but the requests it is answering, which it answers on their own loop.
    """

    def __init__(self, most: int = MOST_PER_BATCH) -> None:
        self._most = most
        self._waiting: list[_Waiting] = []
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None

    async def recommend(self, recommender: Recommender, user_id: str, k: int) -> Recommendation:
        """``recommender.recommend(user_id, k)``, computed on the search thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Recommendation] = loop.create_future()
        with self._ready:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="recommend-search", daemon=True
                )
                self._thread.start()
            self._waiting.append(_Waiting(recommender, user_id, k, future, loop))
            self._ready.notify()
        return await future

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                batch = self._waiting[: self._most]
                del self._waiting[: self._most]
            self._answer(batch)

    @staticmethod
    def _answer(batch: list[_Waiting]) -> None:
        """Recommend for every request of ``batch`` and hand each loop its answers."""
        by_recommender: dict[int, list[_Waiting]] = defaultdict(list)
        for waiting in batch:
            by_recommender[id(waiting.recommender)].append(waiting)
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Waiting, object]]] = defaultdict(list)
        for group in by_recommender.values():
            try:
                outcomes: list[object] = list(
                    group[0].recommender.recommend_many([(w.user_id, w.k) for w in group])
                )
            except Exception as exc:  # every request of the search gets the failure
                outcomes = [exc] * len(group)
            for waiting, outcome in zip(group, outcomes, strict=True):
                by_loop[waiting.loop].append((waiting, outcome))
        for loop, answered in by_loop.items():
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                loop.call_soon_threadsafe(_deliver, answered)


def _deliver(answered: list[tuple[_Waiting, object]]) -> None:
    """On the requests' loop: resolve each future that still waits (a request whose
    client went away has been cancelled)."""
    for waiting, outcome in answered:
        if waiting.future.done():
            continue
        if isinstance(outcome, BaseException):
            waiting.future.set_exception(outcome)
        else:
            waiting.future.set_result(outcome)  # type: ignore[arg-type]
