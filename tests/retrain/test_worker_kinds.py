"""A job runs each epoch on the worker kind its configurator picked: Lambda's kind on the
deployment's runtime, a GPU kind on torch workers billed at the GPU's price, the
in-process kind in this process; the kinds offered default to what the deployment can
run; checkpoints and resume carry a job across kinds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from configurator import CONFIGURATORS, Configurator, Observation
from configurator.gp import GpOptConfigurator
from configurator.kinds import in_process_model
from configurator.space import IN_PROCESS, LAMBDA, EpochConfig
from functions.objectstore import FileObjectStore
from functions.pricing import gpu_prices, lambda_prices
from functions.runtimes import LocalRuntime, ThreadRuntime
from retrain.backends import InProcessBackend
from retrain.coordinator import DistributedBackend
from retrain.job import JobResult, run_training
from retrain.placement import Placement
from retrain.spec import JobSpec
from retrain.window import RatingsWindow
from retrain.worker_kinds import available_kinds, gpu_type, local_gpu_types
from service.retraining import job_spec
from service.settings import Settings
from tests.retrain.test_checkpoints import _Crash, _crash_after, _model, _window

GPU = "gpu-l4"


@pytest.fixture(scope="module")
def window() -> RatingsWindow:
    return _window()


class KindPlan(Configurator):
    """Proposes epoch ``t``'s config on ``kinds[t]`` (the last kind after the list)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        self.kinds = list(kinds)

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        kind = self.kinds[min(epoch, len(self.kinds) - 1)]
        if kind == LAMBDA:
            return EpochConfig(128, 0.05, workers=3, sync_ratio=1.0, memory_mb=512)
        return EpochConfig(128, 0.05, workers=1, sync_ratio=1.0, kind=kind)


@pytest.fixture
def plan(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The kinds the ``plan`` configurator proposes, epoch by epoch (set by the test)."""
    kinds: list[str] = []
    monkeypatch.setitem(CONFIGURATORS, "plan", lambda default, context, history: KindPlan(kinds))
    yield kinds


@pytest.fixture
def placements(tmp_path: Path) -> Iterator[list[Placement]]:
    opened: list[Placement] = []
    yield opened
    for placement in opened:
        placement.close()


def _placement(opened: list[Placement], root: Path) -> Placement:
    store = FileObjectStore(root)
    placement = Placement(store, store.url, lambda_function="unused", configurator_host=None)
    opened.append(placement)
    return placement


def _spec(**kwargs: object) -> JobSpec:
    base = {"factors": 4, "runtime": "thread", "sync": "bsp", "configurator": "plan"}
    return JobSpec(**{**base, "max_epochs": 3, **kwargs})  # type: ignore[arg-type]


def _train(
    placement: Placement, spec: JobSpec, window: RatingsWindow, **kwargs: object
) -> tuple[DistributedBackend, JobResult]:
    model = _model(window)
    backend = placement.backend(1, spec)
    assert isinstance(backend, DistributedBackend)
    configurator = placement.configurator(1, spec, window, model)
    result = run_training(model, window, backend, configurator, spec.rule(), **kwargs)  # type: ignore[arg-type]
    return backend, result


def _kinds_billed(backend: DistributedBackend) -> list[str]:
    return [str(r.labels.get("kind", LAMBDA)) for r in backend.stats.invocations]


# -- each kind where it belongs ---------------------------------------------------------


def test_a_job_on_lambdas_kind_runs_its_workers_on_the_deployments_runtime(
    window: RatingsWindow, tmp_path: Path, plan: list[str], placements: list[Placement]
) -> None:
    plan[:] = [LAMBDA]
    placement = _placement(placements, tmp_path)
    backend, result = _train(placement, _spec(kinds=(LAMBDA, IN_PROCESS, GPU)), window)
    runtime = placement.runtimes["thread"]
    assert isinstance(runtime, ThreadRuntime) and len(runtime.records) == 3 * 3
    assert set(placement.runtimes) == {"thread"}  # no GPU workers started
    assert _kinds_billed(backend) == [LAMBDA] * 9
    prices = lambda_prices()
    for record in backend.stats.invocations:
        assert record.cost_usd == pytest.approx(prices.invocation_cost(record.billed_ms, 512))
    assert result.cost_usd == pytest.approx(backend.stats.cost_usd)


def test_a_job_on_the_in_process_kind_trains_in_this_process_at_its_price(
    window: RatingsWindow, tmp_path: Path, plan: list[str], placements: list[Placement]
) -> None:
    plan[:] = [IN_PROCESS]
    placement = _placement(placements, tmp_path)
    backend, result = _train(placement, _spec(kinds=(LAMBDA, IN_PROCESS)), window)
    lambdas = placement.runtimes.get("thread")
    assert lambdas is None or lambdas.records == []  # type: ignore[attr-defined]
    assert _kinds_billed(backend) == [IN_PROCESS] * 3
    price = in_process_model().second_usd
    for record, epoch in zip(backend.stats.invocations, result.epochs, strict=True):
        assert record.cost_usd == pytest.approx(record.billed_ms / 1000 * price)
        assert epoch.cost_usd == pytest.approx(record.cost_usd) and epoch.cost_usd > 0
    assert result.epochs[-1].loss < result.epochs[0].loss


@pytest.mark.slow
def test_a_job_on_a_gpu_kind_runs_torch_workers_billed_at_the_gpus_price(
    window: RatingsWindow, tmp_path: Path, plan: list[str], placements: list[Placement]
) -> None:
    plan[:] = [GPU]
    placement = _placement(placements, tmp_path)
    backend, result = _train(placement, _spec(runtime="local", kinds=(LAMBDA, GPU)), window)
    gpus = placement.runtimes[f"local:{GPU}"]
    assert isinstance(gpus, LocalRuntime) and gpus.handler == "functions.gpu:handler"
    assert len(gpus.records) == 3 and all(r.ok for r in gpus.records)
    lambdas = placement.runtimes.get("local")
    assert lambdas is None or lambdas.records == []  # type: ignore[attr-defined]
    second = gpu_prices("l4").second_usd
    for record in backend.stats.invocations:
        assert record.labels["kind"] == GPU
        assert record.billed_ms == pytest.approx(
            (record.duration_s + record.init_duration_s) * 1000, abs=1
        )
        assert record.cost_usd == pytest.approx(record.billed_ms / 1000 * second)
    assert result.cost_usd == pytest.approx(sum(r.cost_usd for r in gpus.records))
    assert result.epochs[-1].loss < result.epochs[0].loss


def test_a_kind_the_deployment_does_not_offer_fails_the_epoch_naming_the_setting(
    window: RatingsWindow, tmp_path: Path, plan: list[str], placements: list[Placement]
) -> None:
    plan[:] = [GPU]
    placement = _placement(placements, tmp_path)
    with pytest.raises(ValueError, match="RETRAIN_WORKER_KINDS"):
        _train(placement, _spec(kinds=(LAMBDA, IN_PROCESS)), window)
    assert not any(key.endswith(GPU) for key in placement.runtimes)


# -- across kinds: one model, one checkpoint --------------------------------------------


@pytest.mark.slow
def test_a_job_switching_kinds_resumes_from_its_checkpoint_like_an_uninterrupted_one(
    window: RatingsWindow, tmp_path: Path, plan: list[str], placements: list[Placement]
) -> None:
    plan[:] = [LAMBDA, IN_PROCESS, GPU, LAMBDA]
    spec = _spec(runtime="local", kinds=(LAMBDA, IN_PROCESS, GPU), max_epochs=4)
    _, whole = _train(_placement(placements, tmp_path / "whole"), spec, window)
    assert [e.config["kind"] for e in whole.epochs] == plan

    crashed = _placement(placements, tmp_path / "crashed")
    with pytest.raises(_Crash):
        _train(crashed, spec, window, on_epoch=_crash_after(3))
    crashed.close()
    restarted = _placement(placements, tmp_path / "crashed")
    backend = restarted.resumed_backend(1, spec)
    assert backend is not None and [e.epoch for e in backend.epochs] == [0, 1, 2]
    assert _kinds_billed(backend) == [LAMBDA] * 3 + [IN_PROCESS, GPU]
    configurator = restarted.configurator(1, spec, window, backend.model)
    resumed = run_training(
        None,
        window,
        backend,
        configurator,
        spec.rule(),
        history=backend.epochs,
        prepare=False,
    )
    assert [e.config["kind"] for e in resumed.epochs] == plan
    losses = [e.loss for e in resumed.epochs]
    assert losses == pytest.approx([e.loss for e in whole.epochs], rel=1e-9)
    assert resumed.cost_usd > 0 and _kinds_billed(backend)[-3:] == [LAMBDA] * 3


# -- the kinds offered ------------------------------------------------------------------


def test_a_fresh_install_offers_lambda_and_in_process_and_no_gpu_it_cannot_run(
    tmp_path: Path,
) -> None:
    runtime = ThreadRuntime(concurrency=1)
    try:
        assert available_kinds("sim", runtime) == (LAMBDA,)
        kinds = available_kinds("local", runtime)
        assert kinds[:2] == (LAMBDA, IN_PROCESS)
        assert kinds[2:] == tuple(f"gpu-{t}" for t in local_gpu_types())
    finally:
        runtime.close()


def test_this_machines_gpus_are_offered_by_the_types_the_price_file_knows(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    for n, model in enumerate(("NVIDIA L4", "NVIDIA L40S", "NVIDIA A100-SXM4-40GB")):
        folder = tmp_path / f"0000:0{n}:00.0"
        folder.mkdir()
        (folder / "information").write_text(f"Model: \t\t {model}\nIRQ:   42\n")
    assert local_gpu_types(tmp_path) == ("a100", "l4")
    assert local_gpu_types(tmp_path / "absent") == ()
    assert gpu_type("NVIDIA H100 80GB HBM3") == "h100" and gpu_type("Tesla T4") is None


def test_the_configurator_searches_the_kinds_the_deployment_offers(
    window: RatingsWindow, tmp_path: Path, placements: list[Placement]
) -> None:
    placement = _placement(placements, tmp_path)
    model = _model(window)
    offered = _spec(configurator="gp", kinds=(LAMBDA, IN_PROCESS))
    gp = placement.configurator(1, offered, window, model)
    assert isinstance(gp, GpOptConfigurator) and gp.space.kinds == (LAMBDA, IN_PROCESS)
    fresh = placement.configurator(2, _spec(configurator="gp", runtime="sim"), window, model)
    assert isinstance(fresh, GpOptConfigurator) and fresh.space.kinds == (LAMBDA,)
    here = _spec(configurator="gp", runtime="inprocess")
    assert isinstance(placement.backend(3, here), InProcessBackend)


def test_gp_opt_trains_a_small_window_with_a_loose_deadline_in_this_process(
    window: RatingsWindow, tmp_path: Path, placements: list[Placement]
) -> None:
    placement = _placement(placements, tmp_path)
    spec = _spec(configurator="gp", sync="selective", latency_cap_s=600.0)
    backend, result = _train(placement, spec, window)
    kinds = [e.config["kind"] for e in result.epochs]
    assert kinds == [IN_PROCESS] * len(kinds)
    assert set(_kinds_billed(backend)) == {IN_PROCESS}


# -- settings ---------------------------------------------------------------------------


def test_the_worker_kinds_setting_is_a_list_of_known_kinds_carried_by_the_spec(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, retrain_worker_kinds="lambda, gpu-l4,lambda")
    assert settings.worker_kinds == (LAMBDA, GPU)
    assert job_spec(settings).kinds == (LAMBDA, GPU)
    assert job_spec(Settings(data_dir=tmp_path)).kinds is None
    with pytest.raises(ValueError, match="gpu-t4"):
        Settings(data_dir=tmp_path, retrain_worker_kinds="lambda,gpu-t4")


def test_a_recorded_spec_keeps_its_kinds(tmp_path: Path) -> None:
    spec = JobSpec(kinds=(LAMBDA, IN_PROCESS))
    params = spec.as_params()
    params["kinds"] = list(params["kinds"])  # as the job record's JSON gives it back
    assert JobSpec.from_params(params) == spec
    with pytest.raises(ValueError, match="kinds"):
        JobSpec(kinds=("gpu-t4",))
