"""The ``/recommend`` fast path answers exactly as the FastAPI route, or leaves it to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth.keys import create_key
from service.serving.recommender import Recommender
from service.settings import Settings


def _events(n: int) -> list[dict]:
    return [
        {"user_id": f"u{i % 20}", "item_id": f"i{(i * 7) % 30}", "rating": float(1 + i % 5)}
        for i in range(n)
    ]


@pytest.fixture
def trained(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        client.post("/ingest", json={"events": _events(300)}).raise_for_status()
        client.app.state.driftline.retrainer.wait(timeout=60)  # type: ignore[attr-defined]
        client.app.state.driftline.swapper.follow_registry()  # type: ignore[attr-defined]
        yield client


def _recommender(client: TestClient) -> Recommender:
    return client.app.state.driftline.recommender  # type: ignore[attr-defined]


def _through_the_route(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the fast path step aside (as it does for a large catalogue scored exactly)."""
    monkeypatch.setattr(type(_recommender(client)), "is_quick", property(lambda _: False))


@pytest.mark.parametrize("query", ["user_id=u3&k=5", "user_id=u3", "user_id=stranger&k=4"])
def test_the_fast_path_answers_byte_for_byte_as_the_route(
    trained: TestClient, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    fast = trained.get(f"/recommend?{query}")
    _through_the_route(trained, monkeypatch)
    routed = trained.get(f"/recommend?{query}")
    assert fast.status_code == routed.status_code == 200
    assert fast.content == routed.content
    assert fast.headers["content-type"] == routed.headers["content-type"]
    assert fast.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    "query", ["k=5", "user_id=&k=5", "user_id=u3&k=0", "user_id=u3&k=1001", "user_id=u3&k=x"]
)
def test_what_the_route_refuses_is_left_to_the_route(trained: TestClient, query: str) -> None:
    assert trained.get(f"/recommend?{query}").status_code == 422


def test_fast_answers_are_counted_under_the_routes_label(trained: TestClient) -> None:
    trained.get("/recommend?user_id=u1")
    metrics = trained.get("/metrics").text
    assert 'driftline_request_seconds_count{route="/recommend"}' in metrics
    assert 'route="unmatched"' not in metrics


def test_keys_are_checked_as_the_route_checks_them(trained: TestClient) -> None:
    db = trained.app.state.driftline.db  # type: ignore[attr-defined]
    reader = create_key(db, "reader", ["read"]).token
    writer = create_key(db, "writer", ["ingest"]).token
    trained.app.state.access.ring.refresh()  # type: ignore[attr-defined]
    assert trained.get("/recommend?user_id=u1").status_code == 401
    bad = {"Authorization": "Bearer dl_x_y"}
    assert trained.get("/recommend?user_id=u1", headers=bad).status_code == 401
    basic = {"Authorization": f"Basic {reader}"}
    assert trained.get("/recommend?user_id=u1", headers=basic).status_code == 401
    ingest_only = {"Authorization": f"Bearer {writer}"}
    assert trained.get("/recommend?user_id=u1", headers=ingest_only).status_code == 403
    read = {"Authorization": f"Bearer {reader}"}
    assert trained.get("/recommend?user_id=u1", headers=read).status_code == 200


def test_the_rate_limit_holds_on_the_fast_path(tmp_path_factory: pytest.TempPathFactory) -> None:
    settings = Settings(data_dir=tmp_path_factory.mktemp("limited"), recommend_rate=0.01)
    with TestClient(create_app(settings)) as client:
        assert client.get("/recommend?user_id=u1").status_code == 200
        limited = client.get("/recommend?user_id=u1")
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) >= 1
        assert "over the limit" in limited.json()["detail"]
