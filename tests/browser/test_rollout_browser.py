"""The rollout guard in a real browser: a version in shadow on the versions page and the
overview, with its paired figures and no rollback button, live while events arrive.

A server of its own: the periodic policy publishes a second version, which the guard
runs in shadow and, with the shadow's lengths out of reach, never decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.launcher import ServerProcess
from tests.browser.conftest import ENV, EVENTS, Served, Watched, _key, open_signed_in, wait_for

pytestmark = pytest.mark.slow

#: The guard runs the second version in shadow for good: no lengths it reaches.
SHADOW_ENV = {
    **ENV,
    "DRIFTLINE_GUARD_ENABLED": "true",
    "DRIFTLINE_SHADOW_MIN_EVENTS": "1000000",
    "DRIFTLINE_SHADOW_EARLY_EVENTS": "1000000",
    "DRIFTLINE_SHADOW_MAX_EVENTS": "1000000",
}


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str, str]]:
    """A server serving its first version with the second in shadow: (server, serving
    version, version in shadow)."""
    data_dir = tmp_path_factory.mktemp("rollout") / "data"
    data_dir.mkdir()
    admin, read = _key(data_dir, "operator", "admin"), _key(data_dir, "viewer", "read")
    with ServerProcess(data_dir, env=SHADOW_ENV) as server:
        state = Served(server.url, admin, read, rest=list(EVENTS))
        with state.client() as client:

            def in_shadow() -> tuple[str, str] | None:
                models = client.get("/models").json()
                shadow = [
                    v for v in models["versions"] if (v["guard"] or {}).get("state") == "shadow"
                ]
                if not shadow or client.get("/healthz").json()["retrain_job_running"]:
                    return None
                return models["current"], shadow[0]["version"]

            state.ingest(600)  # the bootstrap version
            wait_for(lambda: client.get("/models").json()["current"], 90, "a first version")
            state.ingest(1_400)  # the periodic policy's second version
            serving, candidate = wait_for(in_shadow, 120, "a version in shadow")
            state.ingest(500)  # compared on these
            wait_for(
                lambda: _guard(client, candidate)["events_compared"] >= 500,
                60,
                "events compared in shadow",
            )
        yield state, serving, candidate


def _guard(client: Any, version: str) -> dict[str, Any]:
    [row] = [v for v in client.get("/models").json()["versions"] if v["version"] == version]
    return row["guard"]


@pytest.fixture
def page(browser: Any, shadowed: tuple[Served, str, str]) -> Iterator[Watched]:
    watched = open_signed_in(browser, shadowed[0], shadowed[0].admin)
    yield watched
    watched.page.context.close()
    assert not watched.problems, watched.problems


def test_the_versions_page_shows_the_version_in_shadow_with_its_figures(
    page: Watched, shadowed: tuple[Served, str, str]
) -> None:
    _served, serving, candidate = shadowed
    page.page.goto("/dashboard/versions")
    row = page.page.locator(f"#versions-rows tr[data-version='{candidate}']")
    row.wait_for()
    assert row.get_attribute("class") == "shadow"
    cell = row.locator("td.rollout")
    assert cell.get_attribute("data-state") == "shadow"
    text = cell.inner_text()
    assert text.startswith("in shadow")
    assert re.search(rf"shadow: [\d,]+ events against {serving};", text), text
    assert "RMSE " in text and "hit-rate@10 " in text and "NDCG@10 " in text
    assert row.locator("button").count() == 0  # no rollback to a version in shadow
    assert row.locator("td", has_text="in shadow").count() == 2
    serving_row = page.page.locator(f"#versions-rows tr[data-version='{serving}']")
    assert serving_row.get_attribute("class") == "serving"
    page.shot("versions-shadow")


def test_the_overview_names_the_version_in_shadow_and_the_figures_grow(
    page: Watched, shadowed: tuple[Served, str, str]
) -> None:
    served, serving, candidate = shadowed
    page.page.goto("/dashboard")
    assert page.page.text_content("#rollout-version") == candidate
    assert page.page.text_content("#rollout-state") == "in shadow"
    assert page.page.text_content("#serving-version") == serving
    with served.client() as client:
        before = _guard(client, candidate)["events_compared"]
    served.ingest(1_000)
    with served.client() as client:
        wait_for(
            lambda: _guard(client, candidate)["events_compared"] > before,
            60,
            "more events compared",
        )
    page.page.reload()
    shown = page.page.locator("#rollout").inner_text()
    with served.client() as client:
        compared = _guard(client, candidate)["events_compared"]
    assert f"{compared:,} events" in shown
    page.shot("overview-shadow")


def test_the_figures_read_without_javascript(
    browser: Any, shadowed: tuple[Served, str, str]
) -> None:
    served, _serving, candidate = shadowed
    context = browser.new_context(base_url=served.url, java_script_enabled=False)
    answer = context.request.post("/dashboard/sign-in", form={"key": served.read}, max_redirects=0)
    assert answer.status == 303
    nojs = context.new_page()
    nojs.goto("/dashboard/versions")
    assert nojs.locator(f"tr.shadow[data-version='{candidate}'] td.rollout").count() == 1
    context.close()
