"""schemathesis over the whole OpenAPI schema of a real ``driftline serve``.

Every route is called with generated valid (positive) and invalid (negative) input; the
run fails on any 5xx and on any answer that its schema does not document (status,
content type or body). The server holds a trained model, jobs and heartbeats first, so
the answers checked are full ones, not only empty lists. It runs on SQLite and, when
``DRIFTLINE_TEST_DATABASE_URL`` is set, on PostgreSQL, whose 32-bit ``INTEGER`` columns
overflow where SQLite's do not. Bounded in examples per operation so each run stays
well under a minute on two cores.

The server has API keys, so access control is on: the run is made once with an admin
key (every route answers for real) and once without a key (every guarded route must
answer its documented 401, whatever the input).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from benchmarks.launcher import ServerProcess  # noqa: E402
from service.auth.keys import create_key  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.store import Database  # noqa: E402
from tests.support.databases import external_url, isolated_schema, not_configured_reason  # noqa: E402

pytestmark = pytest.mark.slow

#: Headers that frame the HTTP message itself. A generated value for one (a
#: ``Content-Length`` of ``).l~``) makes a request that is not HTTP: the server's HTTP
#: layer refuses it with its own 400 before any route sees it, so it tests no API.
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})
#: A generated ``Host`` addresses the request to another site: the hardening layer
#: refuses a host outside ``TRUSTED_HOSTS`` with its own 400 before any route sees it
#: (``tests/service/test_hardening.py`` tests that), so it tests no API either.
LEFT_OUT_HEADERS = FRAMING_HEADERS | {"host"}

CHECKS = (
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str]]:
    """A filled server and its admin key."""
    data_dir: Path = tmp_path_factory.mktemp("fuzz") / "data"
    env = {
        "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
        "DRIFTLINE_BOOTSTRAP_EVENTS": "50",
        "DRIFTLINE_HEARTBEAT_EVENTS": "20",
    }
    with ExitStack() as stack:
        if request.param == "postgresql":
            base = external_url()
            if base is None:
                pytest.skip(not_configured_reason())
            env["DRIFTLINE_DATABASE_URL"] = stack.enter_context(isolated_schema(base))
        settings = Settings(data_dir=data_dir, database_url=env.get("DRIFTLINE_DATABASE_URL"))
        db = Database(settings.resolved_database_url)
        key = create_key(db, "fuzz-administrator", ["admin"]).token
        db.dispose()
        running = stack.enter_context(ServerProcess(data_dir, env=env))
        _fill(running.url, {"Authorization": f"Bearer {key}"})
        yield running, key


def _fill(url: str, auth: dict[str, str]) -> None:
    """Events enough for a bootstrap model, a job and heartbeats."""
    events = [
        {"event_id": f"e{i}", "user_id": f"u{i % 13}", "item_id": f"i{i % 17}", "rating": 1 + i % 5}
        for i in range(200)
    ]
    answer = httpx.post(f"{url}/ingest", json={"events": events}, headers=auth, timeout=120)
    assert answer.status_code == 200, answer.text
    assert httpx.get(f"{url}/drift/heartbeats", headers=auth, timeout=30).json()["heartbeats"]
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/models", headers=auth, timeout=30).json()["current"] is None:
        assert time.monotonic() < deadline, "the bootstrap model was never published"
        time.sleep(0.2)


@pytest.mark.parametrize("caller", ["admin", "anonymous"])
def test_no_answer_is_a_5xx_or_off_schema(server: tuple[ServerProcess, str], caller: str) -> None:
    running, key = server
    headers = {"Authorization": f"Bearer {key}"} if caller == "admin" else {}
    api = schemathesis.openapi.from_url(f"{running.url}/openapi.json")
    failures: dict[str, str] = {}
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 11
    for operation, mode in itertools.product(operations, GenerationMode):
        takes_input = any(True for _ in operation.iter_parameters()) or operation.body
        if mode is GenerationMode.NEGATIVE and not takes_input:
            continue  # nothing to make invalid

        @given(case=operation.as_strategy(mode))
        @settings(
            max_examples=25,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case) -> None:  # type: ignore[no-untyped-def]
            assume(not LEFT_OUT_HEADERS & {name.lower() for name in case.headers or {}})
            response = case.call(headers=headers, timeout=30)
            case.validate_response(response, checks=CHECKS)

        try:
            check()
        except Exception as exc:  # collect every operation's failure, then report them all
            failures[f"{operation.label} ({mode.value})"] = (
                f"{type(exc).__name__}: {str(exc)[:2000]}"
            )
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())
