"""Every setting is a flag of the server's commands; flags beat DRIFTLINE_* variables."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from service.cli import app as server_app
from service.cli import with_settings_flags
from service.settings import Settings


def _capturing_app() -> tuple[typer.Typer, list[Settings]]:
    seen: list[Settings] = []

    def show(settings: Settings) -> None:
        """Capture the settings."""
        seen.append(settings)

    capture = typer.Typer()
    capture.command("show")(with_settings_flags(show))
    capture.command("other")(lambda: None)  # two commands: typer keeps the name
    return capture, seen


@pytest.mark.parametrize("command", ["serve", "consume"])
def test_every_setting_has_a_flag(command: str) -> None:
    result = CliRunner().invoke(server_app, [command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in result.output, name
        assert f"DRIFTLINE_{name.upper()}" in result.output, name
    assert "INTEGER|none" in result.output  # what --refresh-events takes


def test_a_flag_beats_the_environment_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRIFTLINE_RETRAIN_WORKERS", "6")
    monkeypatch.setenv("DRIFTLINE_HEARTBEAT_EVENTS", "250")
    capture, seen = _capturing_app()
    runner = CliRunner()
    result = runner.invoke(
        capture,
        ["show", "--retrain-workers", "9", "--refresh-events", "none", "--no-retrain-enabled"],
    )
    assert result.exit_code == 0, result.output
    settings = seen[-1]
    assert settings.retrain_workers == 9
    assert settings.heartbeat_events == 250
    assert settings.refresh_events is None
    assert settings.retrain_enabled is False
    assert settings.port == 8000


def test_a_bad_value_names_the_flag() -> None:
    capture, _ = _capturing_app()
    result = CliRunner().invoke(capture, ["show", "--retrain-sync", "sometimes"])
    assert result.exit_code == 2
    assert "--retrain-sync" in result.output and "selective" in result.output


def test_serve_shortens_the_interpreters_switch_interval(tmp_path, monkeypatch) -> None:
    """Request latency under ingestion depends on it (BENCHMARKS.md "serve"): the
    setting reaches the interpreter before uvicorn starts."""
    import sys

    import uvicorn

    seen: list[float] = []
    monkeypatch.setattr(uvicorn, "run", lambda *_a, **_kw: seen.append(sys.getswitchinterval()))
    before = sys.getswitchinterval()
    try:
        args = ["serve", "--data-dir", str(tmp_path), "--server-switch-interval-ms", "2"]
        result = CliRunner().invoke(server_app, args)
    finally:
        sys.setswitchinterval(before)
    assert result.exit_code == 0, result.stderr
    assert seen == [pytest.approx(0.002)]
    bad = CliRunner().invoke(server_app, ["serve", "--server-switch-interval-ms", "0"])
    assert bad.exit_code == 2
