"""Settings grouped by concern, documented from the code, and shown with their sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from service.cli import app
from service.settings import GROUPS, Settings, group_of, settings_groups
from service.settings.docs import MASK, markdown

DOCS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_docs_settings_md_is_generated_from_the_fields() -> None:
    assert DOCS.read_text(encoding="utf-8") == markdown(), (
        "docs/settings.md is stale: driftline settings --markdown > docs/settings.md"
    )


def test_every_setting_is_in_exactly_one_group_in_declaration_order() -> None:
    groups = settings_groups()
    listed = [name for names in groups.values() for name in names]
    assert listed == list(Settings.model_fields)
    for group, names in groups.items():
        assert all(group_of(name) == group for name in names)
    with pytest.raises(KeyError):
        group_of("no_such_setting")


def test_every_setting_says_what_it_is() -> None:
    undescribed = [n for n, field in Settings.model_fields.items() if not field.description]
    assert undescribed == []


def test_every_groups_validators_run_in_the_composed_settings() -> None:
    """Two parts' validators of one name would shadow each other in ``Settings``."""
    composed = Settings.__pydantic_decorators__
    for part in GROUPS.values():
        own = part.__pydantic_decorators__
        for kind in ("field_validators", "model_validators"):
            for name, decorator in getattr(own, kind).items():
                used = getattr(composed, kind)[name].func
                assert used.__qualname__ == decorator.func.__qualname__, (part, name)


def _settings(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, ["settings", *args], env=env or {})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"DRIFTLINE_{name.upper()}", raising=False)


@pytest.mark.usefixtures("clean_environment")
def test_settings_says_where_each_value_came_from() -> None:
    env = {"DRIFTLINE_HEARTBEAT_EVENTS": "250", "DRIFTLINE_RETRAIN_WORKERS": "6"}
    shown = _settings("--retrain-workers", "9", "--refresh-events", "none", env=env)
    lines = {line.split("=")[0].strip(): line for line in shown.splitlines() if "=" in line}
    assert lines["retrain_workers"].endswith("= 9  (flag)")
    assert lines["refresh_events"].endswith("= none  (flag)")
    assert lines["heartbeat_events"].endswith("= 250  (env DRIFTLINE_HEARTBEAT_EVENTS)")
    assert lines["port"].endswith("= 8000  (default)")
    headers = [line for line in shown.splitlines() if not line.startswith(" ")]
    assert headers == list(GROUPS)


@pytest.mark.usefixtures("clean_environment")
def test_settings_masks_secrets() -> None:
    env = {
        "DRIFTLINE_DATABASE_URL": "postgresql+psycopg://driftline:hunter2@db:5432/driftline",
        "DRIFTLINE_SESSION_SECRET": "correct-horse-battery",
        "DRIFTLINE_ALERT_WEBHOOK_URL": "https://hooks.slack.example/services/T0/B0/XYZ",
        "DRIFTLINE_OBJECT_STORE_URL": "s3://models/driftline?token=abc123&region=eu",
    }
    for shown in (_settings(env=env), _settings("--json", env=env)):
        for secret in ("hunter2", "correct-horse-battery", "XYZ", "abc123"):
            assert secret not in shown
    figures = json.loads(_settings("--json", env=env))
    assert figures["stack"]["database_url"] == {
        "value": f"postgresql+psycopg://driftline:{MASK}@db:5432/driftline",
        "source": "env",
        "variable": "DRIFTLINE_DATABASE_URL",
    }
    assert figures["security"]["session_secret"]["value"] == MASK
    assert figures["stack"]["object_store_url"]["value"].endswith(f"token={MASK}&region=eu")
    assert figures["security"]["session_hours"] == {"value": 12.0, "source": "default"}


def test_settings_takes_every_flag_serve_does() -> None:
    group = typer.main.get_command(app)

    def flags(command: str) -> set[str]:
        params = group.get_command(None, command).params  # type: ignore[attr-defined]
        return {flag for param in params for flag in param.opts + param.secondary_opts}

    assert {"--retrain-workers", "--no-insecure", "--kafka-group"} <= flags("serve")
    assert flags("serve") <= flags("settings")
    assert CliRunner().invoke(app, ["settings", "--retrain-sync", "sometimes"]).exit_code == 2


def test_settings_markdown_prints_the_reference() -> None:
    assert _settings("--markdown") == markdown()
