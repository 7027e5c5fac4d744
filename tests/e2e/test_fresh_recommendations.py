"""Against a real ``driftline serve``: an acknowledged event is in the user's next answer.

Whatever else is being ingested meanwhile (a writer posts other users' events all
along), a user who posts an event and then asks for recommendations gets an answer
that already leaves the event's item out and scores with the user's updated vector;
a stranger's implicit event leaves its item out of the popular list at once. With an
API key, as deployed: the fast path and the FastAPI route must agree on who may read.
Both with every item scored and with an item index, whose searches run off the event
loop.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from service.auth.keys import create_key
from service.settings import Settings
from service.store import Database
from tests.support.synthetic import stationary_stream

pytestmark = pytest.mark.slow

ENV = {
    "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
    "DRIFTLINE_BOOTSTRAP_EVENTS": "500",
    "DRIFTLINE_REFRESH_EVENTS": "none",
    "DRIFTLINE_MAX_EPOCHS": "3",
    # GP-OPT (the default) takes the cheapest config that meets the deadline, so a
    # job stretches towards it: a short one keeps jobs within the waits here.
    "DRIFTLINE_LATENCY_CAP_SECONDS": "20",
    "DRIFTLINE_REGISTRY_POLL_SECONDS": "1",
}


def _keys(data_dir: Path) -> tuple[str, str]:
    data_dir.mkdir(parents=True)
    db = Database(Settings(data_dir=data_dir).resolved_database_url)
    try:
        admin = create_key(db, "writer", ["admin", "ingest", "read"]).token
        reader = create_key(db, "reader", ["read"]).token
    finally:
        db.dispose()
    return admin, reader


def _items(answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [entry["item_id"] for entry in answer.json()["items"]]


@pytest.mark.parametrize("index", ["exact", "ann"])
def test_each_acknowledged_event_is_reflected_in_the_next_recommendation(
    tmp_path: Path, index: str
) -> None:
    data_dir = tmp_path / "data"
    admin, reader = _keys(data_dir)
    stream = stationary_stream(n_users=60, n_items=200, n_events=1500, seed=5)
    stop = threading.Event()

    def background(url: str) -> None:
        rng = random.Random(1)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}) as client:
            while not stop.is_set():
                events = [
                    {
                        "user_id": f"bg{rng.randint(0, 30)}",
                        "item_id": f"i{rng.randint(0, 199)}",
                        "rating": float(rng.randint(1, 5)),
                    }
                    for _ in range(50)
                ]
                client.post("/ingest", json={"events": events}).raise_for_status()

    with ServerProcess(data_dir, env={**ENV, "DRIFTLINE_SERVING_INDEX": index}) as server:
        write = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"})
        read = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {reader}"})
        write.post("/ingest", json={"events": stream}).raise_for_status()
        deadline = time.monotonic() + 120
        while write.get("/models").json()["current"] is None:
            assert time.monotonic() < deadline, "no version served within 120 s"
            time.sleep(0.2)
        writer = threading.Thread(target=background, args=(server.url,), daemon=True)
        writer.start()
        try:
            for round_ in range(20):
                user = f"u{round_}"
                before = read.get("/recommend", params={"user_id": user, "k": 5})
                assert before.json()["source"] == "model"
                best = _items(before)[0]
                event = {"user_id": user, "item_id": best, "rating": 1.0}
                write.post("/ingest", json={"events": [event]}).raise_for_status()
                after = read.get("/recommend", params={"user_id": user, "k": 5})
                assert best not in _items(after), f"round {round_}: {best} still recommended"
                scores = {e["item_id"]: e["score"] for e in before.json()["items"]}
                moved = [e for e in after.json()["items"] if e["item_id"] in scores]
                assert all(e["score"] != scores[e["item_id"]] for e in moved)

                stranger = f"stranger-{round_}"
                top = _items(read.get("/recommend", params={"user_id": stranger, "k": 5}))[0]
                implicit = {"user_id": stranger, "item_id": top}
                write.post("/ingest", json={"events": [implicit]}).raise_for_status()
                again = read.get("/recommend", params={"user_id": stranger, "k": 5})
                assert again.json()["source"] == "popular" and top not in _items(again)
            # The fast path refuses exactly what the route refuses.
            assert httpx.get(f"{server.url}/recommend?user_id=u1").status_code == 401
            wrong = {"Authorization": "Bearer dl_nope_nope"}
            assert httpx.get(f"{server.url}/recommend?user_id=u1", headers=wrong).status_code == 401
            assert read.get("/recommend", params={"user_id": "u1", "k": 0}).status_code == 422
        finally:
            stop.set()
            writer.join(timeout=30)
            write.close()
            read.close()
