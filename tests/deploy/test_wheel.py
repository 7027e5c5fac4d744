"""The built wheel carries what an installed ``driftline`` reads at run time.

CI installs the wheel and runs the demo outside the checkout; this test says why such a
run works (or which file it lacks) without a fresh environment: the generator's fit, the
meter's prices and the migrations' template are in the wheel, no MovieLens file is (its
licence forbids redistribution), and the generated stream draws from the wheel's fit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Build outputs, caches and environments: not part of the source a wheel is built from.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*_cache", "data"
)

LOAD_SCRIPT = """
import sys
from benchmarks.streams import DEFAULT_FIT, GeneratorConfig, generate_stream, load_fit
assert str(DEFAULT_FIT).startswith(sys.argv[1]), DEFAULT_FIT
print(load_fit().events, len(generate_stream(GeneratorConfig(events=2_000))))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built, as CI builds it, from a copy of the source tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (built,) = tmp.glob("driftline-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_ships_the_generator_fit_and_run_time_files_but_no_data_set(
    wheel: Path,
) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "benchmarks/streams/movielens_fit.json" in names  # parameters, not data
    assert not any("ml-latest-small" in name or "ratings.csv" in name for name in names)
    assert "functions/prices.json" in names
    assert "service/store/migrations/script.py.mako" in names
    vendor = "service/dashboard/static/vendor"
    shipped = {"htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css", "VENDORED.md"}
    shipped |= {"htmx.LICENSE.txt", "uPlot.LICENSE.txt"}  # the vendored files' licences
    assert {f"{vendor}/{name}" for name in shipped} <= names
    assert not any(name.startswith(("tests/", ".ci/")) for name in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "driftline = service.cli:app" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_the_generated_stream_draws_from_the_installed_fit(wheel: Path, tmp_path: Path) -> None:
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    result = subprocess.run(
        # -P: not the checkout, which is the working directory of the test run.
        [sys.executable, "-P", "-c", LOAD_SCRIPT, str(installed)],
        env={**os.environ, "PYTHONPATH": str(installed)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["100836", "2000"]
