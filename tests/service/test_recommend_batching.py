"""The search thread's batches (``service.api.batching``): every request gets its own
answer, whatever else was searched with it, and a failure reaches each request of the
search that failed, not the requests after it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import cast

import pytest

from service.api.batching import RecommendBatcher
from service.serving.recommender import Recommendation
from service.wiring import Driftline


class _Answers:
    """Answers with the user's name and k, records each batch, and fails on request."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.fail = threading.Event()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def recommend_many(self, asked: Sequence[tuple[str, int]]) -> list[Recommendation]:
        self.entered.set()
        self.gate.wait(10)
        self.batches.append(len(asked))
        if self.fail.is_set() and any(user == "boom" for user, _ in asked):
            raise RuntimeError("search failed")
        return [
            Recommendation(user, [(f"{user}-item", float(k))], "v1", "model") for user, k in asked
        ]


def _pipeline(answers: _Answers) -> Driftline:
    return cast(Driftline, answers)


def test_requests_queued_behind_a_search_are_answered_together_each_its_own() -> None:
    answers = _Answers()
    batcher = RecommendBatcher()

    async def ask() -> list[Recommendation]:
        first = asyncio.ensure_future(batcher.recommend(_pipeline(answers), "first", 1))
        while not answers.entered.is_set():  # the thread holds "first" at the gate
            await asyncio.sleep(0.01)
        rest = [
            asyncio.ensure_future(batcher.recommend(_pipeline(answers), f"u{i}", i))
            for i in range(2, 30)
        ]
        await asyncio.sleep(0)  # each queues before the gate opens
        answers.gate.set()
        return await asyncio.gather(first, *rest)

    got = asyncio.run(ask())
    assert [(r.user_id, r.items) for r in got] == [("first", [("first-item", 1.0)])] + [
        (f"u{i}", [(f"u{i}-item", float(i))]) for i in range(2, 30)
    ]
    assert answers.batches == [1, 28]


def test_a_failed_search_fails_its_requests_and_the_next_search_answers() -> None:
    answers = _Answers()
    answers.fail.set()
    answers.gate.set()
    batcher = RecommendBatcher()

    async def ask() -> Recommendation:
        with pytest.raises(RuntimeError, match="search failed"):
            await batcher.recommend(_pipeline(answers), "boom", 1)
        return await batcher.recommend(_pipeline(answers), "after", 2)

    assert asyncio.run(ask()).items == [("after-item", 2.0)]


def test_a_request_cancelled_while_searched_leaves_the_others_answered() -> None:
    answers = _Answers()
    batcher = RecommendBatcher()

    async def ask() -> Recommendation:
        gone = asyncio.ensure_future(batcher.recommend(_pipeline(answers), "gone", 1))
        kept = asyncio.ensure_future(batcher.recommend(_pipeline(answers), "kept", 1))
        while not answers.entered.is_set():
            await asyncio.sleep(0.01)
        gone.cancel()
        answers.gate.set()
        return await kept

    assert asyncio.run(ask()).user_id == "kept"
