"""The dashboard in a real browser: pages load cleanly, charts match the API, live
updates arrive without a reload and keep the zoom, alerts appear live, rollback is an
admin's action. A screenshot of every page is kept (conftest.ARTIFACTS)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser.conftest import Served, Watched, open_signed_in, wait_for

pytestmark = pytest.mark.slow


def _points(page: Any, selector: str) -> int:
    return int(page.get_attribute(selector, "data-points") or 0)


def test_every_page_loads_without_errors(admin_page: Watched, served: Served) -> None:
    page = admin_page.page
    with served.client() as client:
        job_id = client.get("/jobs").json()["jobs"][0]["id"]
        beats = client.get("/drift/heartbeats").json()["heartbeats"]
        versions = client.get("/models").json()["versions"]
    pages = {
        "overview": ("/dashboard", "#accuracy-chart"),
        "alerts": ("/dashboard/alerts", "#alerts-rows"),
        "jobs": ("/dashboard/jobs", "#jobs-rows"),
        "job": (f"/dashboard/jobs/{job_id}", "#loss-chart"),
        "versions": ("/dashboard/versions", "#versions-chart"),
    }
    for name, (path, selector) in pages.items():
        page.goto(path)
        page.wait_for_selector(selector)
        if selector.endswith("chart"):
            wait_for(lambda s=selector: _points(page, s) > 0, 20, f"{name} chart drawn")
        admin_page.shot(name)
    page.goto("/dashboard")
    wait_for(lambda: _points(page, "#accuracy-chart") > 0, 20, "accuracy chart")
    assert _points(page, "#accuracy-chart") >= len(beats)
    page.goto("/dashboard/versions")
    wait_for(lambda: _points(page, "#versions-chart") == len(versions), 20, "versions chart")


def test_the_chart_shows_each_heartbeat_and_live_points_keep_the_zoom(
    admin_page: Watched, served: Served
) -> None:
    page = admin_page.page
    page.goto("/dashboard")
    wait_for(lambda: _points(page, "#accuracy-chart") > 0, 20, "accuracy chart")
    with served.client() as client:
        beats = client.get("/drift/heartbeats").json()["heartbeats"]
    assert _points(page, "#accuracy-chart") == len(beats)
    xs = page.evaluate("window.driftlineCharts.accuracy.data[0]")
    assert xs == [b["events_seen"] for b in beats]
    wait_for(lambda: page.text_content("#live-status") == "live: live", 20, "live stream")

    zoom = {"min": xs[len(xs) // 4], "max": xs[len(xs) // 2]}
    page.evaluate("(z) => window.driftlineCharts.accuracy.setScale('x', z)", zoom)
    before = len(beats)
    served.ingest(600)
    wait_for(lambda: _points(page, "#accuracy-chart") > before, 30, "live heartbeats")
    scale = page.evaluate(
        "({min: window.driftlineCharts.accuracy.scales.x.min,"
        " max: window.driftlineCharts.accuracy.scales.x.max})"
    )
    assert scale == pytest.approx(zoom)
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
    admin_page.shot("overview-live-zoomed")


def test_a_planted_drift_brings_an_alert_row_and_marker_live(
    admin_page: Watched, served: Served
) -> None:
    page = admin_page.page
    page.goto("/dashboard")
    wait_for(lambda: page.text_content("#live-status") == "live: live", 20, "live stream")
    rows = page.locator("#alerts-rows tr[data-alert-id]")
    with served.client() as client:
        known = len(client.get("/drift/alerts").json()["alerts"])
    assert rows.count() == known

    def alerted() -> bool:
        if served.rest:
            served.ingest(250)
        return rows.count() > known

    wait_for(alerted, 120, "an alert row after the planted drift")
    with served.client() as client:
        newest = client.get("/drift/alerts").json()["alerts"][0]
    marked = page.evaluate("window.driftlineCharts.marks().alerts.map(a => a.id)")
    assert newest["id"] in marked  # the chart's red dot
    assert rows.first.get_attribute("data-alert-id") == str(newest["id"])
    admin_page.shot("overview-alert")

    # The periodic retrains these events started swapped versions in: the serving card
    # and the jobs table follow the stream too.
    def card_follows() -> bool:
        with served.client() as client:
            current = client.get("/models").json()["current"]
            newest_job = client.get("/jobs").json()["jobs"][0]["id"]
        shown = page.text_content("#serving-version")
        return (
            shown == current
            and page.locator(f"#jobs-rows tr[data-job-id='{newest_job}']").count() == 1
        )

    wait_for(card_follows, 60, "the serving card and jobs table following swaps")
    page.click(f"#alerts-rows a[href='/dashboard/alerts/{newest['id']}']")
    page.wait_for_selector("h1")
    assert f"Drift alert #{newest['id']}" in page.text_content("h1")
    admin_page.shot("alert")


def test_a_job_page_plots_one_point_per_epoch(admin_page: Watched, served: Served) -> None:
    with served.client() as client:
        job = next(j for j in client.get("/jobs").json()["jobs"] if j["epochs"])
    page = admin_page.page
    page.goto(f"/dashboard/jobs/{job['id']}")
    wait_for(lambda: _points(page, "#loss-chart") > 0, 20, "loss chart")
    assert _points(page, "#loss-chart") == len(job["epochs"])
    assert page.evaluate("window.driftlineCharts.loss.data[1]") == pytest.approx(job["loss_curve"])
    assert page.locator("#epoch-rows tr").count() == len(job["epochs"])
    admin_page.shot("job")


def test_rollback_needs_an_admin_key(browser: Any, served: Served) -> None:
    with served.client() as client:
        # Tests before this one ingest events that start jobs: read the versions once
        # none runs, and roll back to one older than the serving one (a version still
        # being published is listed before it serves, and has no button once it does).
        wait_for(
            lambda: client.get("/healthz").json()["retrain_job_running"] is None,
            120,
            "no job running",
        )
        models = client.get("/models").json()
    earlier = max(v["version"] for v in models["versions"] if v["version"] < models["current"])
    button = f"tr[data-version='{earlier}'] button"

    reader = open_signed_in(browser, served, served.read)
    reader.expected.add("answer 403")
    reader.page.goto("/dashboard/versions")
    reader.page.click(button)
    reader.page.wait_for_load_state()
    assert "admin" in reader.page.content()  # the refusal names the scope it lacks
    reader.page.context.close()
    with served.client() as client:
        # Not rolled back. (A job the earlier tests' events left pending may publish a
        # newer version meanwhile, so "unchanged" is not the invariant; only a rollback
        # can make an older version serve.)
        assert client.get("/models").json()["current"] != earlier

    admin = open_signed_in(browser, served, served.admin)
    admin.page.goto("/dashboard/versions")
    admin.page.click(button)
    admin.page.wait_for_url("**/dashboard/versions")
    assert admin.page.locator(f"tr.serving[data-version='{earlier}']").count() == 1
    admin.shot("versions-rolled-back")
    admin.page.context.close()
    with served.client() as client:
        assert client.get("/models").json()["current"] == earlier
    problems = [p for p in admin.problems]
    assert not problems, problems


def test_the_tables_read_without_javascript(browser: Any, served: Served) -> None:
    context = browser.new_context(base_url=served.url, java_script_enabled=False)
    answer = context.request.post("/dashboard/sign-in", form={"key": served.read}, max_redirects=0)
    assert answer.status == 303
    page = context.new_page()
    with served.client() as client:
        jobs = client.get("/jobs").json()["jobs"]
        versions = client.get("/models").json()["versions"]
    page.goto("/dashboard/jobs")
    assert page.locator("#jobs-rows tr[data-job-id]").count() == len(jobs)
    page.goto("/dashboard/versions")
    assert page.locator("#versions-rows tr[data-version]").count() == len(versions)
    page.goto("/dashboard")
    assert page.locator("#heartbeat-rows tr").count() > 0
    context.close()


def test_without_the_event_stream_the_chart_polls(admin_page: Watched, served: Served) -> None:
    """A proxy that drops server-sent events: the page falls back to polling the JSON."""
    page = admin_page.page
    admin_page.expected.update({"/dashboard/events", "net::ERR_FAILED"})  # the dropped stream
    page.route("**/dashboard/events**", lambda route: route.abort())
    page.goto("/dashboard")
    wait_for(lambda: page.text_content("#live-status") == "live: polling", 30, "polling")
    before = _points(page, "#accuracy-chart")
    served.ingest(300)
    wait_for(lambda: _points(page, "#accuracy-chart") > before, 30, "polled heartbeats")
