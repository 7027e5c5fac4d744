"""The Lambda package: deterministic, and self-sufficient next to numpy and boto3."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.cli import app
from deploy.packaging import build_worker_zip, worker_zip_bytes
from functions.artifacts import model_to_bytes
from functions.handler import handler
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore
from functions.shards import delta_key, shard_key, snapshot_key, write_shard
from tests.support.synthetic import stationary_stream

# What the Lambda Python runtime provides besides the standard library (boto3 and its
# dependencies), plus numpy, which the function gets from a layer.
PROVIDED = ("numpy", "boto3", "botocore", "jmespath", "dateutil", "s3transfer", "urllib3", "six")

# Runs in a bare interpreter (no site-packages) whose sys.path holds the extracted zip, as
# Lambda's /var/task, and numpy: one worker task against a file:// store.
TASK_SCRIPT = """
import importlib.util, json, sys
task_dir, event = sys.argv[1], json.loads(sys.argv[2])
for absent in ("service", "retrain", "configurator", "drift", "benchmarks", "deploy", "tests",
               "river", "sqlalchemy", "torch", "boto3", "functions.runtimes", "functions.gpu"):
    assert importlib.util.find_spec(absent) is None, f"{absent} is importable"
import lambda_function
import functions
assert functions.__file__.startswith(task_dir), functions.__file__
result = lambda_function.handler(event, None)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("boto3", "botocore"))
assert not loaded, loaded
print(json.dumps(result))
"""

# Every module of the zip imports with what Lambda provides, straight from the zip.
IMPORT_SCRIPT = """
import importlib, sys, zipfile
zip_path = sys.argv[1]
for name in zipfile.ZipFile(zip_path).namelist():
    if name.startswith("functions/") and name.endswith(".py"):
        module = name[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        assert importlib.import_module(module).__file__.startswith(zip_path), module
print("ok")
"""


def _bare_python(script: str, path: list[Path], *args: str, cwd: Path) -> str:
    """Run `script` with nothing but the standard library and `path` importable."""
    result = subprocess.run(
        # -P: no script directory on sys.path, -S: no site-packages, -s: no user site.
        # (-I would also ignore PYTHONPATH.) The environment holds nothing else.
        [sys.executable, "-P", "-S", "-s", "-c", script, *args],
        env={"PYTHONPATH": os.pathsep.join(str(p) for p in path)},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _provided_packages(directory: Path, names: tuple[str, ...] = PROVIDED) -> Path:
    """`directory` with a symlink to each installed package of `names` (and numpy.libs)."""
    directory.mkdir()
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            assert name != "numpy"
            continue
        path = Path(module.__file__)
        target = path.parent if path.name == "__init__.py" else path
        (directory / target.name).symlink_to(target)
        if name == "numpy" and (target.parent / "numpy.libs").is_dir():
            (directory / "numpy.libs").symlink_to(target.parent / "numpy.libs")
    return directory


def _tiny_problem(root: Path) -> dict:
    events = stationary_stream(n_users=15, n_items=20, n_events=300, factors=2, seed=4)
    users = [e["user_id"] for e in events]
    items = [e["item_id"] for e in events]
    ratings = np.array([e["rating"] for e in events])
    model = BiasedMF(factors=3, seed=1)
    model.fit(users, items, ratings, epochs=1, batch_size=64)
    store = FileObjectStore(root)
    store.put(snapshot_key("pkg", 0), model_to_bytes(model))
    shard = shard_key("pkg", 0, 1)
    write_shard(store, shard, model.encode_users(users), model.encode_items(items), ratings)
    return {
        "store_url": store.url,
        "job_id": "pkg",
        "epoch": 0,
        "worker": 0,
        "snapshot_key": snapshot_key("pkg", 0),
        "shard_key": shard,
        "delta_key": delta_key("pkg", 0, 0),
        "batch_size": 32,
        "learning_rate": 0.05,
        "regularization": 0.02,
        "local_epochs": 2,
        "seed": 3,
    }


def test_the_zip_is_deterministic_and_holds_only_the_worker(tmp_path: Path) -> None:
    first = build_worker_zip(tmp_path / "a" / "worker.zip")
    second = build_worker_zip(tmp_path / "b" / "worker.zip")
    data = first.path.read_bytes()
    assert data == second.path.read_bytes() == worker_zip_bytes()
    assert first.sha256 == second.sha256 and first.size == len(data)

    with zipfile.ZipFile(first.path) as archive:
        infos = archive.infolist()
        assert archive.testzip() is None
        source = archive.read("lambda_function.py").decode()
    names = [info.filename for info in infos]
    assert names == sorted(names) and names == list(first.entries)
    assert "lambda_function.py" in names and "functions/handler.py" in names
    assert "functions/__init__.py" in names and "functions/mf.py" in names
    assert all(name.endswith(".py") for name in names)
    # Only what the worker imports: no runtimes (they invoke it), no torch worker, no
    # price file (read by the runtimes' meters, not by the worker).
    assert not any(name.startswith("functions/runtimes/") for name in names)
    assert "functions/gpu.py" not in names and "functions/pricing.py" not in names
    assert set(names) == {
        "lambda_function.py",
        *(f"functions/{m}.py" for m in ("__init__", "artifacts", "handler", "ids", "mf")),
        *(f"functions/{m}.py" for m in ("mf_arrays", "mf_checks", "mf_rows", "mf_sgd", "topk")),
        *(f"functions/{m}.py" for m in ("objectstore", "s3", "shards", "trainers")),
    }
    assert not any("__pycache__" in name or "/test" in name for name in names)
    assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert "from functions.handler import handler" in source
    assert first.handler == "lambda_function.handler"


def test_the_extracted_zip_runs_a_worker_task_with_only_numpy(tmp_path: Path) -> None:
    package = build_worker_zip(tmp_path / "worker.zip").path
    task_dir = tmp_path / "task"  # Lambda extracts the zip to /var/task
    with zipfile.ZipFile(package) as archive:
        archive.extractall(task_dir)
    assert not (task_dir / "functions" / "runtimes").exists()
    assert not (task_dir / "functions" / "gpu.py").exists()
    numpy_only = _provided_packages(tmp_path / "numpy-only", ("numpy",))
    event = _tiny_problem(tmp_path / "store")

    out = _bare_python(
        TASK_SCRIPT, [task_dir, numpy_only], str(task_dir), json.dumps(event), cwd=tmp_path
    )
    remote = json.loads(out)
    assert remote["loss_after"] < remote["loss_before"] and remote["samples"] == 300
    written = FileObjectStore(tmp_path / "store").get(event["delta_key"])
    assert remote["delta_sha256"] == hashlib.sha256(written).hexdigest()

    # The same event run here writes the same delta, byte for byte.
    local = handler(dict(event, delta_key="deltas/pkg/000000/local.npz"), None)
    assert local["delta_sha256"] == remote["delta_sha256"]


def test_every_module_of_the_zip_imports_with_what_lambda_provides(tmp_path: Path) -> None:
    package = build_worker_zip(tmp_path / "worker.zip").path
    provided = _provided_packages(tmp_path / "provided")
    assert _bare_python(IMPORT_SCRIPT, [package, provided], str(package), cwd=tmp_path) == "ok"


def test_package_function_command(tmp_path: Path) -> None:
    output = tmp_path / "dist" / "worker.zip"
    result = CliRunner().invoke(app, ["package-function", "--output", str(output)])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last == f"sha256 {build_worker_zip(tmp_path / 'again.zip').sha256}"
    assert output.read_bytes() == worker_zip_bytes()
    assert "lambda_function.handler" in result.output


def _lambda_client(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return boto3.client("lambda", region_name="us-east-1")


def test_deploy_creates_the_function_with_the_zip(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.stub import Stubber

    from deploy.packaging import HANDLER, DeploySpec, deploy_worker

    client = _lambda_client(monkeypatch)
    spec = DeploySpec(role_arn="arn:aws:iam::123456789012:role/worker", layers=("arn:layer:1",))
    with Stubber(client) as stubber:
        stubber.add_client_error("get_function", "ResourceNotFoundException", http_status_code=404)
        stubber.add_response(
            "create_function",
            {"FunctionName": spec.name, "MemorySize": 1769, "Timeout": 900},
            {
                "FunctionName": spec.name,
                "Runtime": "python3.11",
                "Role": spec.role_arn,
                "Handler": HANDLER,
                "Code": {"ZipFile": b"zip-bytes"},
                "MemorySize": 1769,
                "Timeout": 900,
                "Layers": ["arn:layer:1"],
            },
        )
        configuration = deploy_worker(client, spec, code=b"zip-bytes")
        stubber.assert_no_pending_responses()
    assert configuration["MemorySize"] == 1769


def test_deploy_updates_an_existing_function(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.stub import Stubber

    from deploy.packaging import DeploySpec, deploy_worker

    client = _lambda_client(monkeypatch)
    spec = DeploySpec(memory_mb=3008, timeout_s=600)
    with Stubber(client) as stubber:
        stubber.add_response("get_function", {}, {"FunctionName": spec.name})
        stubber.add_response(
            "update_function_code", {}, {"FunctionName": spec.name, "ZipFile": b"new"}
        )
        stubber.add_response(
            "get_function_configuration",
            {"State": "Active", "LastUpdateStatus": "Successful"},
            {"FunctionName": spec.name},
        )
        stubber.add_response(
            "update_function_configuration",
            {"MemorySize": 3008, "Timeout": 600},
            {"FunctionName": spec.name, "MemorySize": 3008, "Timeout": 600, "Layers": []},
        )
        assert deploy_worker(client, spec, code=b"new")["Timeout"] == 600
        stubber.assert_no_pending_responses()


def test_creating_without_a_role_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.stub import Stubber

    from deploy.packaging import DeploySpec, deploy_worker

    client = _lambda_client(monkeypatch)
    with Stubber(client) as stubber:
        stubber.add_client_error("get_function", "ResourceNotFoundException", http_status_code=404)
        with pytest.raises(ValueError, match="needs --role"):
            deploy_worker(client, DeploySpec(), code=b"zip")
    with pytest.raises(ValueError, match="timeout_s"):
        DeploySpec(timeout_s=901)
