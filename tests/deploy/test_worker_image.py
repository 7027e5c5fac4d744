"""The worker image: what ``deploy/worker.Dockerfile`` installs runs the handler.

No Docker engine runs on these machines, so the image's dependency set is built the way
the Dockerfile builds it, in a clean virtual environment: ``deploy/worker-requirements.txt``
(the file the Dockerfile installs) plus the CPU variant's ``awslambdaric`` at the
Dockerfile's version, with ``functions/`` copied beside it as the Dockerfile copies it.
The handler the image's CMD names then trains a shard, resolved by awslambdaric's own
handler lookup, and so does the ``driftline package-function`` zip unpacked there.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from deploy.packaging import HANDLER, worker_zip_bytes
from tests.functions.test_handler import Problem, problem  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "worker.Dockerfile"
REQUIREMENTS = ROOT / "deploy" / "worker-requirements.txt"

#: Run in the clean environment: resolve the handler as the Lambda runtime does, check
#: that nothing of the service's environment is importable, and run one event.
RUN_HANDLER = """
import importlib.util, json, sys
from awslambdaric.bootstrap import _get_handler
leaked = [m for m in ("pydantic", "service", "retrain", "torch") if importlib.util.find_spec(m)]
assert not leaked, f"the worker's environment is not clean: {leaked}"
handler = _get_handler(sys.argv[1])
print(json.dumps(handler(json.loads(sys.argv[2]), None)))
"""


def _arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"deploy/worker.Dockerfile has no ARG {name}"
    return match[1]


def _stage(name: str) -> str:
    text = DOCKERFILE.read_text()
    start = text.index(f" AS {name}\n")
    end = text.find("\nFROM ", start)
    return text[start : None if end < 0 else end]


def test_both_variants_install_the_worker_requirements_file_and_the_package() -> None:
    base = _stage("worker-base")
    assert "COPY deploy/worker-requirements.txt /tmp/worker-requirements.txt" in base
    assert "pip install --no-cache-dir -r /tmp/worker-requirements.txt" in base
    assert "COPY functions ./functions" in base
    assert "FROM worker-base AS worker-cpu" in DOCKERFILE.read_text()
    assert "FROM worker-base AS worker-gpu" in DOCKERFILE.read_text()
    assert DOCKERFILE.read_text().rstrip().endswith("FROM worker-${VARIANT}")
    assert _arg("VARIANT") == "cpu"
    pins = [line for line in REQUIREMENTS.read_text().splitlines() if not line.startswith("#")]
    assert {pin.split("==")[0] for pin in pins if pin} == {"numpy", "boto3"}


def test_the_cpu_variant_is_a_lambda_image_and_the_gpu_variant_a_ray_node() -> None:
    cpu, gpu = _stage("worker-cpu"), _stage("worker-gpu")
    assert 'ENTRYPOINT ["python", "-m", "awslambdaric"]' in cpu
    assert 'CMD ["functions.handler.handler"]' in cpu
    assert '"ray[default]==${RAY_VERSION}"' in gpu and '"torch==${TORCH_VERSION}"' in gpu
    ray = pytest.importorskip("ray")
    # Ray's nodes must run the version of the process that submits the tasks.
    assert _arg("RAY_VERSION") == ray.__version__


@pytest.fixture(scope="module")
def worker_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean environment holding what the CPU image installs; its python."""
    root = tmp_path_factory.mktemp("worker-env")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)]
    install.append(f"awslambdaric=={_arg('AWSLAMBDARIC_VERSION')}")
    result = subprocess.run(install, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr
    return python


def _run(python: Path, task_root: Path, handler: str, event: dict) -> dict:
    result = subprocess.run(
        [str(python), "-c", RUN_HANDLER, handler, json.dumps(event)],
        cwd=task_root,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(task_root), "HOME": str(task_root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_images_handler_trains_a_shard_in_a_clean_environment(
    worker_env: Path,
    problem: Problem,  # noqa: F811
    tmp_path: Path,
) -> None:
    shard = problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool))
    image_root = tmp_path / "image"  # /var/task of the image: COPY functions ./functions
    shutil.copytree(ROOT / "functions", image_root / "functions")
    zip_root = tmp_path / "zip"  # the function's code from `driftline package-function`
    zipfile.ZipFile(io.BytesIO(worker_zip_bytes())).extractall(zip_root)

    for root, handler, delta in (
        (image_root, _stage("worker-cpu").split('CMD ["')[1].split('"')[0], "image"),
        (zip_root, HANDLER, "zip"),
    ):
        event = problem.event(shard, delta_key=f"deltas/job-1/000000/{delta}.pack")
        result = _run(worker_env, root, handler, event)
        assert result["samples"] == len(problem.ratings) and not result["stopped_early"]
        assert result["loss_after"] < result["loss_before"]
        assert problem.store.exists(event["delta_key"])
