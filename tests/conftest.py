"""Fixtures shared by the tests: databases, a settings object and an app on a temp directory.

``database_url`` runs a test on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` names a
PostgreSQL database, on PostgreSQL too, each time on a database of its own: a SQLite file
under the test's ``tmp_path``, or a fresh PostgreSQL schema dropped after the test (see
``tests/support/databases.py``). A test's SQLite file starts as a copy of one migrated
once per test process: migrating each new file would cost every test about half a
second.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from service.app import create_app
from service.settings import Settings
from service.store import Database
from service.wiring import Driftline
from tests.support.databases import external_url, isolated_schema, not_configured_reason
from tests.support.pipelines import pipeline_factory, small_settings


def pytest_report_header(config: pytest.Config) -> str:
    base = external_url()
    if base is None:
        return f"databases: sqlite only ({not_configured_reason()})"
    shown = make_url(base).render_as_string(hide_password=True)
    return f"databases: sqlite and postgresql ({shown}, one schema per test)"


@pytest.fixture(autouse=True)
def _testclient_host_is_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starlette's ``TestClient`` calls the app as ``Host: testserver``; trust it beside
    the default loopback names (tests of ``TRUSTED_HOSTS`` pass their own)."""
    monkeypatch.setenv("DRIFTLINE_TRUSTED_HOSTS", "127.0.0.1,localhost,::1,testserver")


@pytest.fixture
def postgresql_url() -> Iterator[str]:
    """A URL selecting a fresh schema on the configured PostgreSQL; skips when none is."""
    base = external_url()
    if base is None:
        pytest.skip(not_configured_reason())
    with isolated_schema(base) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's own database: SQLite where ``driftline serve`` puts it (migrated), or
    PostgreSQL."""
    if request.param == "sqlite":
        path = tmp_path / "data" / "driftline.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        _copy_sqlite(request.getfixturevalue("migrated_sqlite"), path)
        return f"sqlite:///{path}"
    return request.getfixturevalue("postgresql_url")


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database at the newest migration, made once per test process."""
    path = tmp_path_factory.mktemp("migrated") / "driftline.db"
    Database(f"sqlite:///{path}").dispose()
    return path


def _copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of ``source`` (SQLite's backup, whatever its journal holds)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        bootstrap_events=200,
        heartbeat_events=100,
        max_epochs=8,
        factors=8,
        retrain_runtime="thread",  # workers on threads: unit tests start no processes
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def small_pipelines(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    """Pipelines on the test's data directory and database with small settings (a
    bootstrap after 200 events, heartbeats of 50, two epochs on threads, no refresh, no
    registry polling), each overridable; a second call is a restart. All are closed
    after the test."""
    with pipeline_factory(
        lambda **overrides: small_settings(tmp_path / "data", database_url, **overrides)
    ) as make:
        yield make
