"""The docker-compose stack, checked without a Docker engine.

The compose file is validated against the Compose Specification's JSON schema (as
vendored by check-jsonschema), every image is pinned, every published port is bound to
loopback, every dependency waits on a condition; Prometheus's configuration and alert
rules pass ``promtool check`` and the rules' unit tests (Debian's ``prometheus``
package; ``.ci/run`` installs it); the rules and the Grafana dashboard only use metrics
Driftline exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from service.metrics import Metrics
from service.wiring import RETRAIN_SHUTDOWN_GRACE_S

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _compose_schema() -> dict[str, Any]:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(vendored.read_text())


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema = _compose_schema()
    jsonschema.validate(_compose(), schema)
    broken = _compose()
    broken["services"]["driftline"]["depends_on"]["postgres"]["condition"] = "whenever"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_the_stack_has_every_service_users_deploy() -> None:
    services = _compose()["services"]
    assert {"postgres", "kafka", "kafka-topic", "minio", "minio-bucket", "driftline"} <= set(
        services
    )
    assert {"consume-0", "consume-1", "prometheus", "grafana"} <= set(services)
    env = services["driftline"]["environment"]
    assert env["DRIFTLINE_OBJECT_STORE_URL"].startswith("s3://")
    assert env["DRIFTLINE_S3_ENDPOINT_URL"] == "http://minio:9000"
    replicas = {services[f"consume-{n}"]["environment"]["DRIFTLINE_KAFKA_REPLICA"] for n in (0, 1)}
    assert replicas == {"0", "1"}
    assert services["consume-0"]["command"] == ["driftline", "consume"]


def test_every_image_is_pinned_to_a_version() -> None:
    for name, service in _compose()["services"].items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"
    base = re.search(r"^FROM (\S+)", (DEPLOY / "Dockerfile").read_text(), re.M)
    assert base and re.fullmatch(r"python:\d+\.\d+\.\d+-slim", base.group(1)), base


def test_every_published_port_is_bound_to_loopback() -> None:
    for name, service in _compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_every_dependency_waits_on_a_condition_the_dependency_can_meet() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            condition = rule["condition"]
            assert condition in ("service_healthy", "service_completed_successfully"), name
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits on {dependency}"


def test_the_image_runs_unprivileged_and_creates_its_first_admin_key() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^USER driftline$", dockerfile, re.M)
    command = re.search(r"^CMD (.+)$", dockerfile, re.M)
    assert command is not None
    assert "driftline keys create admin --scope admin --if-absent" in command.group(1)
    assert "exec driftline serve" in command.group(1)


def test_driftline_containers_are_given_time_to_stop_cleanly() -> None:
    """Docker kills 10 s after its SIGTERM by default; a stopping service gives a running
    retraining job ``RETRAIN_SHUTDOWN_GRACE_S`` and then flushes."""
    services = _compose()["services"]
    driftline = [s for s in services.values() if s.get("image", "").startswith("driftline:")]
    assert len(driftline) >= 3
    for service in driftline:
        grace = service.get("stop_grace_period", "10s")
        assert re.fullmatch(r"\d+s", grace), grace
        assert int(grace[:-1]) >= RETRAIN_SHUTDOWN_GRACE_S + 10


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return subprocess.run(
        ["promtool", *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "config", "prometheus.yml"),
        ("check", "rules", "alerts.yml"),
        ("test", "rules", "alerts_test.yml"),
    ],
    ids=["config", "rules", "rule-tests"],
)
def test_promtool_accepts_the_configuration_and_the_rules(args: tuple[str, ...]) -> None:
    result = _promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_the_issue_names_exists() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert {
        "DriftlineDriftDetected",
        "DriftlineRetrainJobFailed",
        "DriftlineRetrainBudgetSpent",
        "DriftlineConsumerLag",
        "DriftlineErrorRate",
        "DriftlineServingLatency",
        "DriftlineModelRolledBack",
        "DriftlineAlertWebhookFailing",
    } <= names


def _exported() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        names |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count")}
    return names


@pytest.mark.parametrize(
    "path", ["prometheus/alerts.yml", "grafana/driftline.json"], ids=["rules", "dashboard"]
)
def test_rules_and_dashboard_use_only_exported_metrics(path: str) -> None:
    used = set(re.findall(r"\bdriftline_[a-z_]+", (DEPLOY / path).read_text()))
    used -= {"driftline_consume", "driftline_serve"}  # job names, not metrics
    assert used, path
    assert used <= _exported(), sorted(used - _exported())


def test_prometheus_scrapes_the_services_the_stack_runs() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    services = _compose()["services"]
    for target in targets:
        host, port = target.split(":")
        assert host in services, target
        if host.startswith("consume-"):
            assert services[host]["environment"]["DRIFTLINE_METRICS_PORT"] == port


def test_grafana_is_provisioned_with_the_dashboard_and_prometheus() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "driftline.json").read_text())
    assert dashboard["uid"] == "driftline" and len(dashboard["panels"]) >= 6
    sources = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert sources["datasources"][0]["url"] == "http://prometheus:9090"
    volumes = _compose()["services"]["grafana"]["volumes"]
    assert any("driftline.json" in volume for volume in volumes)
