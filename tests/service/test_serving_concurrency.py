"""Serving under concurrency: ingestion of new users and items, hot swaps and readers at once.

Readers take the serving model's published view without a lock (``service.serving.model``);
this drives writers, swaps and readers on threads against one pipeline and checks that no
read fails and every answer's items belong to the version it names.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from functions.mf import BiasedMF
from service.settings import Settings
from service.store.events import NewEvent
from service.wiring import Driftline, build_driftline
from tests.support.synthetic import stationary_stream

SWAPS = 4


def _events(stream: list[dict]) -> list[NewEvent]:
    return [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]


@pytest.fixture
def pipeline(tmp_path: Path, database_url: str) -> Iterator[Driftline]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        retrain_enabled=False,
        heartbeat_events=200,
        registry_poll_seconds=None,
    )
    built = build_driftline(settings, background_retrain=False)
    yield built
    built.retrainer.close()
    built.db.dispose()


def _publish_versions(pipeline: Driftline, n: int) -> dict[str, set[str]]:
    """``n`` versions trained on different slices of a stream; version → its item ids."""
    stream = stationary_stream(n_users=80, n_items=120, n_events=3000, seed=3)
    pipeline.ingest(_events(stream))
    items_of = {}
    for k in range(n):
        part = stream[k * 500 : (k + 2) * 500]
        model = BiasedMF(factors=4, seed=k)
        users = [e["user_id"] for e in part]
        items = [e["item_id"] for e in part]
        ratings = np.array([e["rating"] for e in part])
        model.grow(users, items)
        model.fit_epoch(model.encode_users(users), model.encode_items(items), ratings)
        published = pipeline.registry.publish(model, last_event_id=3000, job_id=None, rmse=None)
        items_of[published.version] = set(model.item_ids)
    return items_of


def test_readers_never_fail_while_new_ids_stream_in_and_versions_swap(
    pipeline: Driftline,
) -> None:
    items_of = _publish_versions(pipeline, SWAPS)
    versions = list(items_of)
    pipeline.swapper.swap_to(versions[0])
    stop = threading.Event()
    errors: list[BaseException] = []
    answers = {"model": 0, "popular": 0}
    wrong: list[tuple[str, str]] = []
    known_users = [f"u{k}" for k in range(80)]

    def guarded(work):  # type: ignore[no-untyped-def]
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # every failure is the test's business
                errors.append(exc)
                stop.set()

        return threading.Thread(target=run)

    def ingest(writer: int) -> None:
        rng = random.Random(writer)
        batch_number = 0
        while not stop.is_set() and batch_number < 60:
            batch = [
                NewEvent(
                    rng.choice([f"w{writer}-{batch_number}-{j % 50}", rng.choice(known_users)]),
                    f"new-item-{writer}-{batch_number}-{j % 40}",
                    float(rng.randint(1, 5)),
                    None,
                    None,
                )
                for j in range(200)
            ]
            pipeline.ingest(batch)
            batch_number += 1

    def read(reader: int) -> None:
        rng = random.Random(100 + reader)
        while not stop.is_set():
            user = rng.choice(known_users + [f"w0-{rng.randint(0, 30)}-{rng.randint(0, 49)}"])
            answer = pipeline.recommender.recommend(user, 10)
            answers[answer.source] += 1
            if answer.source == "model":
                foreign = [i for i, _ in answer.items if i not in items_of[answer.model_version]]
                if foreign:
                    wrong.append((answer.model_version, foreign[0]))

    def swap() -> None:
        for version in versions[1:] + versions[:1]:
            if stop.is_set():
                return
            pipeline.swapper.swap_to(version)

    writers = [guarded(lambda w=w: ingest(w)) for w in range(2)]
    readers = [guarded(lambda r=r: read(r)) for r in range(3)]
    swapper = guarded(swap)
    for thread in readers + writers + [swapper]:
        thread.start()
    for thread in writers + [swapper]:
        thread.join(timeout=240)
    stop.set()
    for thread in readers:
        thread.join(timeout=30)

    assert errors == []
    assert wrong == []
    assert answers["model"] > 100
    assert pipeline.learner.serving.version == versions[0]
