"""Abuse limits: 429 with Retry-After per key, and the per-key item cap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth.keys import create_key
from service.settings import Settings
from service.store import Database


def _keyed_client(
    tmp_path: Path, names: list[str], scopes: tuple[str, ...] = ("admin",), **values: object
) -> tuple[TestClient, dict]:
    settings = Settings(data_dir=tmp_path / "data", **values)
    db = Database(settings.resolved_database_url)
    headers = {
        name: {"Authorization": f"Bearer {create_key(db, name, list(scopes)).token}"}
        for name in names
    }
    db.dispose()
    return TestClient(create_app(settings)), headers


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[TestClient, dict]]:
    client, headers = _keyed_client(
        tmp_path,
        ["one", "two"],
        recommend_rate=0.01,
        recommend_burst=3,
        ingest_rate_events=0.01,
        ingest_burst_events=10,
        max_batch_events=10,
    )
    with client:
        yield client, headers


def _events(n: int, item: str = "i") -> dict:
    return {"events": [{"user_id": f"u{k}", "item_id": f"{item}{k}"} for k in range(n)]}


def test_recommend_requests_past_the_burst_get_429_with_retry_after(limited: tuple) -> None:
    client, headers = limited
    answers = [client.get("/recommend?user_id=u", headers=headers["one"]) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    assert int(answers[-1].headers["retry-after"]) >= 1
    assert "requests/s" in answers[-1].json()["detail"]
    # Another key has a bucket of its own.
    assert client.get("/recommend?user_id=u", headers=headers["two"]).status_code == 200


def test_ingest_counts_events_not_requests(limited: tuple) -> None:
    client, headers = limited
    assert client.post("/ingest", json=_events(8), headers=headers["one"]).status_code == 200
    over = client.post("/ingest", json=_events(3, "j"), headers=headers["one"])
    assert over.status_code == 429
    assert "events/s" in over.json()["detail"] and over.headers["retry-after"]
    assert client.post("/ingest", json=_events(2, "k"), headers=headers["one"]).status_code == 200
    assert client.get("/healthz").json()["events_stored"] == 10  # the refused batch: none
    metrics = client.get("/metrics").text
    assert 'driftline_ingest_rejected_total{reason="rate_limited"} 1.0' in metrics


def test_open_loopback_use_is_limited_per_address(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", recommend_rate=0.01, recommend_burst=2)
    with TestClient(create_app(settings)) as client:
        codes = [client.get("/recommend?user_id=u").status_code for _ in range(3)]
    assert codes == [200, 200, 429]


def test_the_item_cap_holds_one_key_to_a_few_events_per_item(tmp_path: Path) -> None:
    client, headers = _keyed_client(
        tmp_path, ["attacker", "other"], ingest_item_cap=3, scopes=("ingest",)
    )
    pushed = {
        "events": [
            {"user_id": f"sock{k}", "item_id": "<script>alert(1)</script>", "rating": 5.0}
            for k in range(12)
        ]
    }
    with client:
        answer = client.post("/ingest", json=pushed, headers=headers["attacker"])
        assert answer.status_code == 429
        assert "at most 3 events per item" in answer.json()["detail"]
        assert int(answer.headers["retry-after"]) >= 1
        three = {"events": pushed["events"][:3]}
        assert client.post("/ingest", json=three, headers=headers["attacker"]).status_code == 200
        one_more = {"events": pushed["events"][3:4]}
        assert client.post("/ingest", json=one_more, headers=headers["attacker"]).status_code == 429
        assert client.post("/ingest", json=one_more, headers=headers["other"]).status_code == 200
        assert client.get("/healthz").json()["events_stored"] == 4


def test_administrators_bulk_loads_are_not_capped_per_item(tmp_path: Path) -> None:
    client, headers = _keyed_client(tmp_path, ["operator"], ingest_item_cap=3)
    many = {"events": [{"user_id": f"u{k}", "item_id": "hit"} for k in range(20)]}
    with client:
        assert client.post("/ingest", json=many, headers=headers["operator"]).status_code == 200


@pytest.mark.parametrize(("cap", "attack_wins"), [(None, True), (3, False)])
def test_a_dozen_sock_puppet_events_take_over_the_popular_list_only_without_the_cap(
    tmp_path: Path, cap: int | None, attack_wins: bool
) -> None:
    """What a stranger is recommended: five real fans of "hit" against one key posting
    twelve 5-star events for an invented item from twelve invented users, one at a time
    as an attacker retrying past refusals would."""
    client, headers = _keyed_client(
        tmp_path, ["attacker"], scopes=("ingest", "read"), ingest_item_cap=cap
    )
    evil = "<script>alert(1)</script>"
    organic = [{"user_id": f"fan{k}", "item_id": "hit", "rating": 4.0} for k in range(5)]
    organic += [{"user_id": f"fan{k}", "item_id": "hit", "rating": 4.0} for k in range(5)]
    with client:
        shop = create_key(client.app.state.driftline.db, "shop", ["admin"]).token  # type: ignore[attr-defined]
        client.app.state.access.ring.refresh()  # type: ignore[attr-defined]
        headers["shop"] = {"Authorization": f"Bearer {shop}"}
        assert client.post("/ingest", json={"events": organic}, headers=headers["shop"]).is_success
        for k in range(12):
            event = {"user_id": f"sock{k}", "item_id": evil, "rating": 5.0}
            client.post("/ingest", json={"events": [event]}, headers=headers["attacker"])
        answer = client.get("/recommend?user_id=stranger&k=3", headers=headers["shop"]).json()
    top = answer["items"][0]["item_id"]
    assert answer["source"] == "popular"
    assert (top == evil) is attack_wins, answer
