"""GP-OPT in the service's configurator process: same decisions, kept observations, and
a dead or failing child that costs a job its search but not the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from configurator import EpochConfig, History, JobContext, Observation, make_configurator
from configurator.performance import EpochModel
from configurator.process import (
    NICENESS,
    ConfiguratorHost,
    HostedConfigurator,
    HostedError,
    _Open,
    answer_timeout_s,
)
from functions.objectstore import FileObjectStore
from tests.configurator.test_gp import DEFAULT, _observe
from tests.support.pipelines import pipeline_factory, small_settings


def _context() -> JobContext:
    return JobContext(100_000, 8, 10_000, 60.0, None, 10, job_id="job-7", max_workers=16)


@pytest.fixture
def host() -> Iterator[ConfiguratorHost]:
    """A host of its own, for a test that kills, stalls or must not start its child."""
    started = ConfiguratorHost()
    yield started
    started.close()


@pytest.fixture(scope="module")
def serving_host() -> Iterator[ConfiguratorHost]:
    """One host for the tests that only ask its child (torch's import costs seconds a
    child): each leaves it serving."""
    started = ConfiguratorHost()
    yield started
    started.close()


def _run(
    configurator: HostedConfigurator, history: list[Observation], count: int
) -> list[Observation]:
    """``count`` more epochs of ``history``, each decided by ``configurator``."""
    truth, rng = EpochModel.prior(), np.random.default_rng(len(history))
    for _ in range(count):
        config = configurator.propose(len(history), history)
        assert configurator.last_decision is not None, f"epoch {len(history)}: no decision"
        history.append(_observe(truth, config, 0.97 ** (len(history) + 1), rng))
    return history


def test_gp_opt_decides_in_the_child_as_it_would_in_process(
    serving_host: ConfiguratorHost, tmp_path: Path
) -> None:
    store = FileObjectStore(tmp_path)
    hosted = make_configurator("gp", DEFAULT, _context(), History(store), host=serving_host)
    assert isinstance(hosted, HostedConfigurator)
    in_process = make_configurator("gp", DEFAULT, _context())
    first = hosted.propose(0, [])
    assert first == in_process.propose(0, [])  # the calibrated prior's pick: deterministic
    assert serving_host.pid is not None and serving_host.pid != os.getpid()

    history = _run(hosted, [_observe(EpochModel.prior(), first, 0.97, np.random.default_rng())], 3)
    hosted.close(history)
    kept = History(store).load()
    assert [job.job_id for job in kept] == ["job-7"] and len(kept[0].epochs) == 4
    assert kept[0].hyperparameters  # the child's fitted GPs came back with the epochs


def test_a_dead_child_costs_the_job_its_search_and_the_next_job_gets_a_new_one(
    host: ConfiguratorHost,
) -> None:
    hosted = host.configurator("gp", DEFAULT, _context(), None)
    _run(hosted, [], 1)
    first_pid = host.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    assert hosted.propose(1, []) == DEFAULT and hosted.last_decision is None
    assert hosted.propose(2, []) == DEFAULT
    hosted.close()

    after = host.configurator("gp", DEFAULT, _context(), None)
    _run(after, [], 2)
    assert host.pid not in (None, first_pid)
    after.close()


def test_a_stalled_child_costs_the_job_its_search_not_its_deadline(
    host: ConfiguratorHost,
) -> None:
    """A child that does not answer in time is given up on, not waited for: the job goes
    on with the default config, and the child, kept, serves the next job once it runs
    again (the answers it owed are dropped, not taken for the next job's)."""
    _run(host.configurator("gp", DEFAULT, _context(), None), [], 1)
    pid = host.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        stalled = HostedConfigurator(host, "gp", DEFAULT, _context(), None, timeout_s=0.5)
        assert stalled.propose(0, []) == DEFAULT and stalled.last_decision is None
        stalled.close()
        assert time.monotonic() - started < 5
    finally:
        os.kill(pid, signal.SIGCONT)
    after = host.configurator("gp", DEFAULT, _context(), None)
    _run(after, [], 2)
    assert host.pid == pid
    after.close()


def test_a_job_s_configurator_may_take_a_share_of_its_deadline() -> None:
    short, long = (JobContext(1_000, latency_cap_s=cap) for cap in (5.0, 400.0))
    assert answer_timeout_s(short) == answer_timeout_s(None) >= 5.0
    assert answer_timeout_s(short) < answer_timeout_s(long) < 400.0


def test_the_child_decides_at_a_lower_priority(serving_host: ConfiguratorHost) -> None:
    """It imports at the service's priority (once, at start) and decides below it."""
    _run(serving_host.configurator("gp", DEFAULT, _context(), None), [], 1)
    assert serving_host.pid is not None
    assert (
        os.getpriority(os.PRIO_PROCESS, serving_host.pid)
        == os.getpriority(os.PRIO_PROCESS, 0) + NICENESS
    )


def test_an_error_in_the_child_is_named_and_leaves_it_serving(
    serving_host: ConfiguratorHost,
) -> None:
    with pytest.raises(HostedError, match="unknown configurator 'nope'"):
        serving_host.call(_Open("k", "nope", DEFAULT, _context(), []))
    _run(serving_host.configurator("gp", DEFAULT, _context(), None), [], 1)


def test_static_never_needs_the_child(host: ConfiguratorHost) -> None:
    static = make_configurator("static", DEFAULT, _context(), host=host)
    assert not isinstance(static, HostedConfigurator) and host.pid is None


def test_a_gp_service_starts_the_process_s_configurator_host_before_any_job(
    tmp_path: Path,
) -> None:
    database = f"sqlite:///{tmp_path / 'driftline.db'}"
    with pipeline_factory(small_settings) as make:
        first = make(tmp_path, database, retrain_configurator="gp")
        host = first.retrainer._configurator_host
        assert host is ConfiguratorHost.shared() and host.pid is not None
        again = make(tmp_path / "b", database, retrain_configurator="gp")
        assert again.retrainer._configurator_host is host  # one child per process
        in_process = make(tmp_path / "c", database, retrain_configurator_process=False)
        assert in_process.retrainer._configurator_host is None


def test_the_child_exits_when_its_service_dies(tmp_path: Path) -> None:
    """A killed service leaves no configurator process behind: the child reads the end
    of its connection and returns."""
    script = (
        "from configurator.process import ConfiguratorHost\n"
        "host = ConfiguratorHost(); host.start(); print(host.pid, flush=True)\n"
        "import time; time.sleep(600)\n"
    )
    service = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert service.stdout is not None
    child = int(service.stdout.readline())
    service.kill()
    service.wait()
    deadline = time.monotonic() + 60
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(child)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: its parent here was killed)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_without_a_context_the_child_proposes_the_default(serving_host: ConfiguratorHost) -> None:
    default = EpochConfig(**{**DEFAULT.as_dict(), "workers": 2})
    assert serving_host.configurator("gp", default, None, None).propose(0, []) == default


def test_after_warming_up_a_refit_imports_nothing() -> None:
    """The child warms up before any job: a job's first refit, on the child's CPU share
    beside the service, then loads no module (torch and gpytorch cost seconds)."""
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from configurator.surrogate import GpytorchSurrogate, warm_up\n"
        "assert 'gpytorch' not in sys.modules\n"
        "warm_up()\n"
        "before = set(sys.modules)\n"
        "x = np.random.default_rng(1).random((20, 5))\n"
        "GpytorchSurrogate().fit(x, x.sum(1), optimise=True)\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc")
def test_a_started_child_loads_torch_before_any_job(host: ConfiguratorHost) -> None:
    host.start()
    assert host.pid is not None
    maps = Path(f"/proc/{host.pid}/maps")
    deadline = time.monotonic() + 120
    while "libtorch" not in maps.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "libtorch" in maps.read_text()
