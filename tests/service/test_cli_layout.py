"""The ``driftline`` command is the server's; its tooling joins from ``benchmarks`` by name,
imported only when asked for, so a server process never imports ``benchmarks``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import typer
from typer.testing import CliRunner

from service.cli import TOOLING_COMMANDS, app

ROOT = Path(__file__).resolve().parents[2]

#: Runs ``driftline ARGS...`` in this interpreter, then prints the benchmarks modules loaded.
DRIFTLINE_THEN_MODULES = """
import json, sys
from service.cli import app
try:
    app(sys.argv[1:], prog_name="driftline")
except SystemExit as exit:
    assert exit.code in (None, 0), exit.code
loaded = sorted(m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks."))
print(json.dumps(loaded))
"""


def _benchmarks_modules_after(*args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", DRIFTLINE_THEN_MODULES, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_console_script_is_the_servers_command() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["driftline"] == "service.cli:app"


def test_serving_commands_never_import_benchmarks() -> None:
    assert _benchmarks_modules_after("serve", "--help") == []
    assert _benchmarks_modules_after("consume", "--help") == []
    assert _benchmarks_modules_after("settings", "--json") == []


def test_a_tooling_command_imports_its_module_only_when_run() -> None:
    assert "benchmarks.cli" in _benchmarks_modules_after("bench", "--help")


def test_service_modules_do_not_import_benchmarks() -> None:
    """Not at module level, nor lazily: the CLI looks its tooling up by name."""
    offenders = []
    for path in sorted((ROOT / "service").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            if any(m.split(".")[0] == "benchmarks" for m in modules):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_the_tooling_commands_are_the_ones_benchmarks_defines() -> None:
    from benchmarks.cli import tooling

    group = typer.main.get_command(tooling)
    assert set(TOOLING_COMMANDS) == set(group.commands)  # type: ignore[attr-defined]


def test_bench_help_lists_the_benchmarks() -> None:
    from benchmarks.bench import BENCHMARKS

    result = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for name in BENCHMARKS:
        assert name in result.output, name


def test_driftline_help_lists_the_servers_and_the_tooling_commands() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("serve", "consume", "keys", "settings", *TOOLING_COMMANDS):
        assert f" {name} " in result.output, name
