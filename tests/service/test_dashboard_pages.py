"""The dashboard's pages: rendered from the same data as the JSON endpoints, escaped,
readable without JavaScript; acknowledging and rolling back are admin actions.

Through the real app on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` is set, on
PostgreSQL, with a bootstrap job that really ran.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth.keys import create_key
from service.auth.sessions import CSRF_FIELD
from service.settings import Settings
from service.store import Database
from service.store.alerts import add_alert
from tests.support.synthetic import stationary_stream

EVENTS = [
    dict(e, event_id=f"e{i}")
    for i, e in enumerate(stationary_stream(n_users=30, n_items=25, n_events=500, seed=4))
]
HOSTILE = "<script>alert(1)</script>"


def _served(client: TestClient, headers: dict[str, str] | None = None) -> int:
    """Ingest past the bootstrap, wait for its job's version to serve, plant an alert
    (its model version a hostile string); the alert's id."""
    for start in range(0, len(EVENTS), 100):
        answer = client.post(
            "/ingest", json={"events": EVENTS[start : start + 100]}, headers=headers
        )
        assert answer.status_code == 200, answer.text
    pipeline = client.app.state.driftline
    deadline = time.monotonic() + 60
    while pipeline.learner.current is None and time.monotonic() < deadline:
        pipeline.swapper.follow_registry()
        time.sleep(0.1)
    assert pipeline.learner.current is not None
    with pipeline.db.begin() as conn:
        return add_alert(
            conn,
            metric="rmse",
            before=0.8,
            after=1.0,
            events_seen=450,
            model_version=HOSTILE,
            detector="page-hinkley",
            change_events=300,
        )


@pytest.fixture
def served(client: TestClient) -> tuple[TestClient, int]:
    return client, _served(client)


def test_every_page_renders_with_its_navigation(served: tuple[TestClient, int]) -> None:
    client, alert_id = served
    job_id = client.get("/jobs").json()["jobs"][0]["id"]
    for path, heading in [
        ("/dashboard", "Overview"),
        ("/dashboard/alerts", "Drift alerts"),
        (f"/dashboard/alerts/{alert_id}", f"Drift alert #{alert_id}"),
        ("/dashboard/jobs", "Retraining jobs"),
        (f"/dashboard/jobs/{job_id}", f"Retraining job #{job_id}"),
        ("/dashboard/versions", "Model versions"),
    ]:
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["content-type"].startswith("text/html")
        assert f"<h1>{heading}</h1>" in answer.text
        for link in ("/dashboard", "/dashboard/alerts", "/dashboard/jobs", "/dashboard/versions"):
            assert f'href="{link}"' in answer.text
        assert "<style>" not in answer.text and "style=" not in answer.text  # CSP: 'self'
        assert re.search(r"<script>(?!alert)", answer.text) is None  # no inline script


def test_tables_carry_the_data_without_javascript(served: tuple[TestClient, int]) -> None:
    client, alert_id = served
    overview = client.get("/dashboard").text
    version = client.get("/models").json()["current"]
    assert version in overview
    assert f'data-alert-id="{alert_id}"' in overview
    job = client.get("/jobs").json()["jobs"][0]
    page = client.get(f"/dashboard/jobs/{job['id']}").text
    assert page.count("<tr><td>") >= len(job["epochs"])  # one row per epoch
    assert job["trigger"] in page and job["policy"] in page
    alert = client.get(f"/dashboard/alerts/{alert_id}").text
    assert "detection delay 150 events" in alert and "rise 25.0 %" in alert
    assert version in client.get("/dashboard/versions").text


def test_values_are_escaped(served: tuple[TestClient, int]) -> None:
    client, alert_id = served
    for path in ("/dashboard", "/dashboard/alerts", f"/dashboard/alerts/{alert_id}"):
        text = client.get(path).text
        assert HOSTILE not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_the_accuracy_data_matches_the_heartbeats(served: tuple[TestClient, int]) -> None:
    client, alert_id = served
    data = client.get("/dashboard/data/accuracy").json()
    beats = client.get("/drift/heartbeats").json()["heartbeats"]
    assert [b["events_seen"] for b in data["heartbeats"]] == [b["events_seen"] for b in beats]
    assert [b["rmse"] for b in data["heartbeats"]] == pytest.approx([b["rmse"] for b in beats])
    assert [a["id"] for a in data["alerts"]] == [alert_id]
    assert data["jobs"] and all(j["start_events"] <= j["end_events"] for j in data["jobs"])
    version = client.get("/models").json()["current"]
    assert [s["version"] for s in data["swaps"]][-1] == version  # the bootstrap's swap


def test_the_overview_shows_kafka_lag_per_partition_when_consuming(
    served: tuple[TestClient, int],
) -> None:
    from types import SimpleNamespace

    from service.ingest.kafka import ConsumerState

    client, _ = served
    assert "not consuming" in client.get("/dashboard").text
    state = ConsumerState(
        connected=True, partitions=[0, 1], positions={0: 120, 1: 80}, lag={0: 7, 1: 0}
    )
    client.app.state.consumer = SimpleNamespace(state=state)
    try:
        text = client.get("/dashboard").text
    finally:
        client.app.state.consumer = None
    assert "<tr><td>0</td><td>120</td><td>7</td></tr>" in text
    assert "<tr><td>1</td><td>80</td><td>0</td></tr>" in text


def test_unknown_ids_are_404_and_bad_ids_422(client: TestClient) -> None:
    assert client.get("/dashboard/alerts/99").status_code == 404
    assert client.get("/dashboard/jobs/99").status_code == 404
    assert client.get("/dashboard/jobs/abc").status_code == 422
    assert client.post("/drift/alerts/99/acknowledge").status_code == 404


def test_pages_render_before_any_data(client: TestClient) -> None:
    for path in ("/dashboard", "/dashboard/alerts", "/dashboard/jobs", "/dashboard/versions"):
        answer = client.get(path)
        assert answer.status_code == 200 and 'class="empty"' in answer.text
    assert client.get("/dashboard/data/accuracy").json()["heartbeats"] == []


def test_acknowledging_is_recorded_once(served: tuple[TestClient, int]) -> None:
    client, alert_id = served
    first = client.post(f"/drift/alerts/{alert_id}/acknowledge")
    assert first.status_code == 200 and first.json()["acknowledged_at"] is not None
    again = client.post(f"/drift/alerts/{alert_id}/acknowledge").json()
    assert again["acknowledged_at"] == first.json()["acknowledged_at"]
    assert (
        client.get(f"/drift/alerts/{alert_id}").json()["acknowledged_by"]
        == first.json()["acknowledged_by"]
    )
    assert "not yet" not in client.get(f"/dashboard/alerts/{alert_id}").text


@pytest.fixture
def keyed(settings: Settings) -> Iterator[tuple[TestClient, dict[str, str]]]:
    # The rollback form needs a second version serving at once, without a shadow.
    settings = settings.model_copy(update={"guard_enabled": False})
    db = Database(settings.resolved_database_url)
    tokens = {scope: create_key(db, f"{scope}-key", [scope]).token for scope in ("read", "admin")}
    db.dispose()
    with TestClient(create_app(settings), follow_redirects=False) as client:
        yield client, tokens


def _session(client: TestClient, key: str) -> str:
    """Sign in with ``key``; the CSRF token its pages carry."""
    client.cookies.clear()
    assert client.post("/dashboard/sign-in", data={"key": key}).status_code == 303
    found = re.search(rf'name="{CSRF_FIELD}" value="([0-9a-f]+)"', client.get("/dashboard").text)
    assert found
    return found.group(1)


def test_acknowledge_and_rollback_forms_need_an_admin(
    keyed: tuple[TestClient, dict[str, str]],
) -> None:
    client, tokens = keyed
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    alert_id = _served(client, admin)
    assert client.post("/retrain", headers=admin).status_code == 202
    pipeline = client.app.state.driftline
    first = pipeline.learner.current.version
    deadline = time.monotonic() + 60
    while pipeline.learner.current.version == first and time.monotonic() < deadline:
        pipeline.swapper.follow_registry()
        time.sleep(0.1)
    assert pipeline.learner.current.version != first

    token = _session(client, tokens["read"])
    refused = client.post(f"/dashboard/alerts/{alert_id}/acknowledge", data={CSRF_FIELD: token})
    assert refused.status_code == 403
    refused = client.post(f"/dashboard/versions/{first}/rollback", data={CSRF_FIELD: token})
    assert refused.status_code == 403

    token = _session(client, tokens["admin"])
    no_csrf = client.post(f"/dashboard/alerts/{alert_id}/acknowledge", data={})
    assert no_csrf.status_code == 403
    done = client.post(f"/dashboard/alerts/{alert_id}/acknowledge", data={CSRF_FIELD: token})
    assert done.status_code == 303 and done.headers["location"] == f"/dashboard/alerts/{alert_id}"
    assert "by admin-key" in client.get(f"/dashboard/alerts/{alert_id}").text
    rolled = client.post(f"/dashboard/versions/{first}/rollback", data={CSRF_FIELD: token})
    assert rolled.status_code == 303
    assert client.get("/models").json()["current"] == first
    again = client.post(f"/dashboard/versions/{first}/rollback", data={CSRF_FIELD: token})
    assert again.status_code == 409  # already serving: said by name, not a 500


def test_the_overview_shows_the_replica_and_the_leader(served: tuple[TestClient, int]) -> None:
    client, _ = served
    cluster = client.get("/healthz").json()["cluster"]
    text = client.get("/dashboard").text
    section = text[text.index('id="cluster"') :]
    assert f"replica <b>{cluster['replica_id']}</b>: <b>leads</b>" in section
    assert f"leader {cluster['leader_id']} (fencing token {cluster['fencing_token']})" in section
    assert f"event log applied to {cluster['applied_position']}; 0 behind" in section


def test_the_overview_says_the_stream_process_consumes_kafka(
    served: tuple[TestClient, int],
) -> None:
    client, _ = served
    settings = client.app.state.settings
    client.app.state.settings = settings.model_copy(
        update={"kafka_bootstrap": "kafka:9092", "stream_process": True}
    )
    try:
        text = client.get("/dashboard").text
    finally:
        client.app.state.settings = settings
    assert "consumed by this replica's stream process" in text
    assert "not consuming" not in text
