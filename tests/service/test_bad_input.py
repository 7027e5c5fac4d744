"""Bad requests get a 4xx that names the problem, never a 500, and store nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from service.app import create_app
from service.settings import Settings
from service.stream.writer import StoreFailed

JSON = {"content-type": "application/json"}


def _stored(client: TestClient) -> int:
    return client.get("/healthz").json()["events_stored"]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 1000 + b"]" * 1000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"events": [{"user_id": ' + b"[" * 5000 + b"]" * 5000 + b', "item_id": "i"}]}',
        b'{"events": [{"user_id": "u", "item_id": "i", "rating": 1' + b"0" * 5000 + b"}]}",
        b'{"events": [{"user_id": "u", "item_id": "i", "timestamp": ' + b"9" * 5000 + b"}]}",
        b'{"events": [{"user_id": "u", "item_id": "i", "rating": 1e999}]}',
        b'{"events": [{"user_id": 18446744073709551616, "item_id": "i"}]}',
        b"\xff\xfe",
        b"",
    ],
    ids=[
        "nest-1000",
        "nest-100000",
        "nested-field",
        "huge-int",
        "huge-ts",
        "1e999",
        "2^64",
        "utf16",
        "empty",
    ],
)
def test_hostile_bodies_are_a_4xx_and_store_nothing(client: TestClient, body: bytes) -> None:
    response = client.post("/ingest", content=body, headers=JSON)
    assert response.status_code in (400, 422), response.text
    assert response.json()["detail"]
    assert _stored(client) == 0


@pytest.mark.parametrize("field", ["user_id", "item_id", "event_id"])
def test_an_id_holding_nul_is_a_422_naming_it(client: TestClient, field: str) -> None:
    """PostgreSQL's text columns refuse NUL: it must be refused before SQL, on every store."""
    event = {"event_id": "e", "user_id": "u", "item_id": "i", field: "a\x00b"}
    response = client.post("/ingest", json={"events": [event]})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == field
    assert _stored(client) == 0


@pytest.mark.parametrize(
    "mark",
    ["\x1b[2J", "\x7f", "\x85", "\u202e", "\u2066", "\u200b", "\u200d", "\ufeff", "\u2028"],
    ids=["escape", "del", "c1", "rlo", "lri", "zwsp", "zwj", "bom", "line-sep"],
)
@pytest.mark.parametrize("field", ["user_id", "item_id", "event_id"])
def test_an_id_holding_a_control_or_invisible_mark_is_a_422_naming_it(
    client: TestClient, field: str, mark: str
) -> None:
    """Ids an operator cannot read as they are (Trojan Source) never reach the store."""
    event = {"event_id": "e", "user_id": "u", "item_id": "i", field: f"admin{mark}x"}
    response = client.post("/ingest", json={"events": [event]})
    assert response.status_code == 422, response.text
    problem = response.json()["detail"][0]
    assert problem["field"] == field
    assert "control characters" in problem["msg"]
    assert _stored(client) == 0


def test_ids_in_any_script_are_accepted(client: TestClient) -> None:
    event = {"user_id": "Zoë", "item_id": "東京物語 (1953)", "rating": 4.5}
    assert client.post("/ingest", json={"events": [event]}).status_code == 200


@pytest.mark.parametrize(
    "timestamp", [0, 631151999.0, 1e12, 4102444800.0], ids=["1970", "1989", "ms", "2100"]
)
def test_a_timestamp_outside_the_window_is_a_422_naming_it(
    client: TestClient, timestamp: float
) -> None:
    event = {"user_id": "u", "item_id": "i", "rating": 4.0, "timestamp": timestamp}
    response = client.post("/ingest", json={"events": [event]})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["field"] == "timestamp"
    assert "outside" in response.json()["detail"][0]["msg"]
    assert _stored(client) == 0


def test_the_timestamp_window_is_a_setting(tmp_path: Path, database_url: str) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        timestamp_min=0,
        timestamp_ahead_seconds=0,
    )
    with TestClient(create_app(settings)) as open_window:
        old = {"user_id": "u", "item_id": "i", "timestamp": 1.0}
        assert open_window.post("/ingest", json={"events": [old]}).status_code == 200
        ahead = {"user_id": "u", "item_id": "i", "timestamp": time.time() + 60}
        assert open_window.post("/ingest", json={"events": [ahead]}).status_code == 422


def test_a_user_id_holding_nul_is_a_422_on_recommend(client: TestClient) -> None:
    response = client.get("/recommend", params={"user_id": "a\x00b"})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", "user_id"]


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_ingest_takes_only_json(client: TestClient, content_type: str | None) -> None:
    body = b'{"events": [{"user_id": "u", "item_id": "i", "rating": 4}]}'
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/ingest", content=body, headers=headers)
    assert response.status_code == 415
    assert "application/json" in response.json()["detail"]
    assert _stored(client) == 0
    ok = client.post(
        "/ingest", content=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/jobs/2147483648",
        "/jobs/9223372036854775808",
        "/jobs/99999999999999999999999999999",
        "/jobs/0",
        "/jobs/-1",
        "/drift/heartbeats?since_events=9223372036854775808",
        "/drift/heartbeats?since_events=-1",
        "/drift/alerts?limit=" + "9" * 5000,
        "/recommend?user_id=u&k=" + "9" * 5000,
        "/jobs?limit=1e3",
    ],
)
def test_out_of_range_integers_are_a_422(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 422, response.text


def test_the_largest_id_is_a_404_not_an_overflow(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    largest = schema["paths"]["/jobs/{job_id}"]["get"]["parameters"][0]["schema"]["maximum"]
    assert client.get(f"/jobs/{largest}").status_code == 404
    beyond = client.get(f"/jobs/{largest + 1}")
    assert beyond.status_code == 422
    assert str(largest) in beyond.text  # the message names the bound
    assert client.get("/drift/heartbeats?since_events=9223372036854775807").status_code == 200


def test_refusals_and_request_latency_reach_the_metrics(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = client.app.state.settings.max_batch_events
    client.post("/ingest", content=b"{", headers=JSON)
    client.post("/ingest", content=b"{}", headers={"content-type": "text/plain"})
    client.post("/ingest", json={"events": [{"user_id": "u"}]})
    client.post("/ingest", json={"events": [{"user_id": "u", "item_id": "i"}] * (limit + 1)})
    lost = OperationalError("INSERT INTO events", None, ConnectionRefusedError("refused"))
    monkeypatch.setattr(client.app.state.driftline.writer, "store_all", _failing_store(lost))
    assert (
        client.post("/ingest", json={"events": [{"user_id": "u", "item_id": "i"}]}).status_code
        == 503
    )
    client.get("/recommend?user_id=u")
    client.get("/jobs/7")
    client.get("/jobs/8")
    text = client.get("/metrics").text
    for reason in (
        "bad_json",
        "unsupported_media_type",
        "invalid_event",
        "too_large",
        "unavailable",
    ):
        assert f'driftline_ingest_rejected_total{{reason="{reason}"}} 1.0' in text
    assert 'driftline_request_seconds_count{route="/recommend"} 1.0' in text
    assert 'driftline_request_seconds_count{route="/ingest"} 5.0' in text
    # One series per route template, not per id asked for.
    assert 'driftline_request_seconds_count{route="/jobs/{job_id}"} 2.0' in text
    assert "/jobs/7" not in text


def test_an_unknown_path_is_timed_as_unmatched(client: TestClient) -> None:
    assert client.get("/no/such/path/42").status_code == 404
    text = client.get("/metrics").text
    assert 'driftline_request_seconds_count{route="unmatched"} 1.0' in text
    assert "/no/such/path" not in text


def _failing_store(exc: Exception) -> Callable[..., object]:
    """The writer's ``store_all`` when its transaction fails with ``exc``."""

    def store_all(*args: object, **kwargs: object) -> object:
        raise StoreFailed("not stored") from exc

    return store_all


def test_the_schema_documents_ingest_and_every_answer(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ingest = schema["paths"]["/ingest"]["post"]
    body = ingest["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/IngestBatch"}
    assert "IngestBatch" in schema["components"]["schemas"]
    assert {"200", "400", "413", "415", "422", "503"} <= set(ingest["responses"])
    assert "text/plain" in schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "404" in schema["paths"]["/jobs/{job_id}"]["get"]["responses"]
    job_id = schema["paths"]["/jobs/{job_id}"]["get"]["parameters"][0]["schema"]
    assert (job_id["minimum"], job_id["maximum"]) == (1, 2**31 - 1)  # retrain_jobs.id


def test_every_route_documents_a_body_schema_for_each_answer(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    untyped = [
        f"{method.upper()} {path} {code}"
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        for code, answer in operation["responses"].items()
        if not answer.get("content") or any(not c.get("schema") for c in answer["content"].values())
    ]
    assert not untyped
    assert "503" in schema["paths"]["/dashboard"]["get"]["responses"]
