"""Worker kinds on a Ray cluster (RETRAIN_RUNTIME=ray), against a local Ray instance that
declares one GPU of type L4 (no GPU needed: the torch worker runs on the CPU there): the
cluster's GPU types are offered, a GPU kind's epochs are Ray tasks with a GPU each,
billed at the type's price, and Lambda's kind stays on CPU tasks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from configurator.space import IN_PROCESS, LAMBDA
from functions.pricing import gpu_prices
from functions.runtimes import RayRuntime
from retrain.placement import Placement
from tests.retrain.test_worker_kinds import (  # noqa: F401  (fixtures)
    GPU,
    _kinds_billed,
    _placement,
    _spec,
    _train,
    placements,
    plan,
    window,
)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray_with_an_l4() -> Iterator[None]:
    """One local instance for the module, with a GPU of type L4 declared."""
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,
        resources={"accelerator_type:L4": 1.0},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


def test_the_clusters_gpu_types_are_offered(
    tmp_path: Path,
    placements: list[Placement],  # noqa: F811
) -> None:
    placement = _placement(placements, tmp_path)
    assert placement.kinds(_spec(runtime="ray")) == (LAMBDA, IN_PROCESS, GPU)


def test_a_gpu_kinds_epochs_are_ray_tasks_with_a_gpu_billed_at_its_price(
    window,  # noqa: F811
    tmp_path: Path,
    plan: list[str],  # noqa: F811
    placements: list[Placement],  # noqa: F811
) -> None:
    plan[:] = [LAMBDA, GPU, GPU]
    placement = _placement(placements, tmp_path)
    backend, result = _train(placement, _spec(runtime="ray"), window)
    gpus = placement.runtimes[f"ray:{GPU}"]
    cpus = placement.runtimes["ray"]
    assert isinstance(gpus, RayRuntime) and isinstance(cpus, RayRuntime)
    assert (gpus.num_gpus, gpus.handler) == (1.0, "functions.gpu:handler")
    assert cpus.num_gpus == 0 and len(cpus.records) == 3
    assert len(gpus.records) == 2 and all(r.ok for r in gpus.records)
    assert _kinds_billed(backend) == [LAMBDA] * 3 + [GPU] * 2
    second = gpu_prices("l4").second_usd
    for record in gpus.records:
        assert record.cost_usd == pytest.approx(record.billed_ms / 1000 * second)
    assert [e.config["kind"] for e in result.epochs] == plan
    assert result.epochs[-1].loss < result.epochs[0].loss
