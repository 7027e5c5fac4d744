"""Browser tests: Debian's Chromium driven by Playwright against a real ``driftline
serve`` on loopback.

One server per module, with an admin and a read key, a first version and a refresh
version trained on a synthetic stream whose taste changes later (the tests ingest the
changed part while a page is open). Every page a test opens records console errors,
failed requests and 4xx/5xx answers, and fails the test on any it did not expect; a
screenshot of every page is kept in ``$DRIFTLINE_TEST_ARTIFACTS`` (default
``tests/browser/artifacts``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from tests.support.synthetic import planted_drift_stream

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("DRIFTLINE_TEST_ARTIFACTS", Path(__file__).parent / "artifacts"))

playwright_api = pytest.importorskip("playwright.sync_api")
if shutil.which(CHROMIUM) is None:
    pytest.skip(
        f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)",
        allow_module_level=True,
    )

ENV = {
    "DRIFTLINE_RETRAIN_POLICY": "periodic",
    "DRIFTLINE_PERIODIC_EVENTS": "1000",
    "DRIFTLINE_BOOTSTRAP_EVENTS": "500",
    "DRIFTLINE_HEARTBEAT_EVENTS": "50",
    "DRIFTLINE_FACTORS": "8",
    "DRIFTLINE_MAX_EPOCHS": "5",
    # GP-OPT (the default) takes the cheapest config that meets the deadline, so a
    # job stretches towards it: a short one keeps jobs within the waits here.
    "DRIFTLINE_LATENCY_CAP_SECONDS": "20",
    "DRIFTLINE_RETRAIN_RUNTIME": "local",
    "DRIFTLINE_KEY_REFRESH_SECONDS": "0.2",
    # Each version serves once published, so there is an earlier one to roll back to;
    # the rollout guard's shadow has a server of its own (test_rollout_browser.py).
    "DRIFTLINE_GUARD_ENABLED": "false",
}
#: The stream: its taste changes at event 3,000.
EVENTS = planted_drift_stream(n_users=150, n_items=200, n_events=9_000, drift_at=3_000, seed=11)
PREFIX = 2_000


@dataclass
class Served:
    """The running server, its keys and the events not yet ingested."""

    url: str
    admin: str
    read: str
    rest: list[dict[str, Any]] = field(default_factory=list)

    def client(self, key: str | None = None) -> httpx.Client:
        token = key or self.admin
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def ingest(self, count: int) -> None:
        batch, self.rest = self.rest[:count], self.rest[count:]
        with self.client() as client:
            for start in range(0, len(batch), 250):
                answer = client.post("/ingest", json={"events": batch[start : start + 250]})
                answer.raise_for_status()


def _key(data_dir: Path, name: str, scope: str) -> str:
    command = [sys.executable, "-m", "service", "keys", "create", name, "--scope", scope]
    done = subprocess.run(
        [*command, "--data-dir", str(data_dir)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def wait_for(check: Any, seconds: float = 60.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; that value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached within {seconds:.0f} s")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("browser") / "data"
    data_dir.mkdir()
    admin, read = _key(data_dir, "operator", "admin"), _key(data_dir, "viewer", "read")
    with ServerProcess(data_dir, env=ENV) as server:
        state = Served(server.url, admin, read, rest=list(EVENTS))
        with state.client() as client:
            # The bootstrap version, then (the periodic policy counting events after it)
            # a second one, so that there is something to roll back to.
            for ingested, versions in ((600, 1), (PREFIX - 600, 2)):
                state.ingest(ingested)
                wait_for(
                    lambda n=versions: (
                        len(client.get("/models").json()["versions"]) >= n
                        and client.get("/healthz").json()["retrain_job_running"] is None
                    ),
                    90,
                    f"{versions} versions",
                )
        yield state


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield chromium
        chromium.close()


@dataclass
class Watched:
    """A signed-in page and what went wrong on it."""

    page: Any
    problems: list[str]
    expected: set[str] = field(default_factory=set)

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def _watch(page: Any, problems: list[str]) -> None:
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def failed(request: Any) -> None:
        # ERR_ABORTED is the browser cancelling its own request: a page left (a form
        # posted, a link followed) while its event stream or a chart's data fetch is in
        # flight. Faults of the server show as answers >= 400 or as other net:: errors.
        if "ERR_ABORTED" in (request.failure or ""):
            return
        problems.append(f"failed: {request.url} {request.failure}")

    page.on("requestfailed", failed)
    page.on(
        "response",
        lambda r: r.status >= 400 and problems.append(f"answer {r.status}: {r.url}"),
    )


def open_signed_in(browser: Any, served: Served, key: str) -> Watched:
    """A new browser context signed in with ``key`` through the sign-in form's endpoint."""
    context = browser.new_context(base_url=served.url, viewport={"width": 1280, "height": 900})
    answer = context.request.post("/dashboard/sign-in", form={"key": key}, max_redirects=0)
    assert answer.status == 303, answer.text()
    page = context.new_page()
    problems: list[str] = []
    _watch(page, problems)
    return Watched(page, problems)


@pytest.fixture
def admin_page(browser: Any, served: Served) -> Iterator[Watched]:
    watched = open_signed_in(browser, served, served.admin)
    yield watched
    unexpected = [p for p in watched.problems if not any(e in p for e in watched.expected)]
    watched.page.context.close()
    assert not unexpected, unexpected
