"""Configurators that decide in a process of their own.

GP-OPT's decision and its background refits are many small numpy and torch operations,
and between them Python code that holds the interpreter lock. Run inside the serving
process they queue ``/recommend``'s threads behind them, multiplying its tail latency
(``docs/decisions/0003-gp-opt-surrogate-and-decision-time.md``). In a child process
they compete for a core, which the operating system shares out, and never for the lock.

:class:`ConfiguratorHost` owns one child process, started once and reused by every job
(:meth:`ConfiguratorHost.shared`: one per service process, however many pipelines it
builds, stopped at exit; the child also exits when its parent dies). The child is a
fresh interpreter, ``python -m configurator.process`` (a fork of a threaded server is
unsafe, and multiprocessing's spawn re-imports the caller's main module), started
ahead of the first job because torch's import costs seconds. It imports at the
service's CPU priority, once, and then decides at a lower one: at that priority on a
saturated machine the import would starve, and the first job with it
(``docs/decisions/0003``). A job's
configurator is a :class:`HostedConfigurator`, a proxy that sends only the epochs the
child has not seen and gets back the config and the decision. The child never touches
the object store: the proxy reads earlier jobs' observations before the job and keeps
the job's own when it ends, so the store's credentials and clients stay in the service.

If the child dies, the configurator in it raises, or it does not answer within the
job's share of its deadline (:func:`answer_timeout_s`), the job goes on with its
default config vector (the static configurator's), logged. A dead child is restarted
on the next call; a slow one is kept, and the answer it owes is dropped when it comes.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from configurator.base import Configurator, Decision, JobContext, Observation
from configurator.history import History, PastJob
from configurator.registry import make_configurator
from configurator.space import EpochConfig

log = logging.getLogger(__name__)

#: Seconds a closing host waits for its child before terminating it.
STOP_TIMEOUT_S = 10.0
#: How much lower the child's CPU priority is than the service's (``os.nice``), as the
#: local runtime's containers: on a busy machine retraining yields to ``/recommend``; on
#: an idle one a decision takes as long as ever.
NICENESS = 10
#: The share of a job's deadline its configurator may take to answer one call, and the
#: least time it is given (the first call of a freshly started child waits for torch):
#: the configurator is there to meet the deadline, not to spend it.
ANSWER_SHARE = 0.25
MIN_ANSWER_TIMEOUT_S = 10.0


class HostUnavailable(RuntimeError):
    """The configurator process died or could not be started."""


class HostTimedOut(HostUnavailable):
    """The configurator process did not answer in time (it is kept, and its late answer
    dropped)."""


class HostedError(RuntimeError):
    """The configurator in the child process raised (its traceback is in the log)."""


def answer_timeout_s(context: JobContext | None) -> float:
    """How long a job's configurator may take to answer one call: its share of the
    job's deadline, at least :data:`MIN_ANSWER_TIMEOUT_S`."""
    if context is None:
        return MIN_ANSWER_TIMEOUT_S
    return max(MIN_ANSWER_TIMEOUT_S, ANSWER_SHARE * context.latency_cap_s)


@dataclass(frozen=True)
class _Open:
    key: str
    name: str
    default: EpochConfig
    context: JobContext | None
    past: list[PastJob]


@dataclass(frozen=True)
class _Propose:
    key: str
    epoch: int
    new_observations: list[Observation]


@dataclass(frozen=True)
class _Close:
    key: str
    new_observations: list[Observation]


@dataclass(frozen=True)
class _Drop:
    """Forget a job whose proxy gave up waiting (nothing is kept)."""

    key: str


class _KeptHistory(History):
    """The child's view of the store: earlier jobs given by the parent, and the job to
    keep handed back to it instead of written."""

    def __init__(self, past: list[PastJob]) -> None:
        self.past = past
        self.kept: PastJob | None = None

    def load(self) -> list[PastJob]:
        return list(self.past)

    def save(self, job: PastJob) -> None:
        self.kept = job


@dataclass
class _Hosted:
    configurator: Configurator
    history: _KeptHistory
    observations: list[Observation]


def _serve(connection: Connection) -> None:
    """The child's loop: one configurator per open job, each request answered in order
    under its sequence number."""
    hosted: dict[str, _Hosted] = {}
    while True:
        try:
            request = connection.recv()
        except EOFError:  # the service went away
            return
        if request is None:
            return
        sequence, message = request
        try:
            answer = _answer(message, hosted)
        except Exception as exc:
            log.exception("configurator process: %s failed", type(message).__name__)
            connection.send((sequence, "error", f"{type(exc).__name__}: {exc}"))
        else:
            connection.send((sequence, "ok", answer))


def _answer(message: Any, hosted: dict[str, _Hosted]) -> Any:
    if isinstance(message, _Open):
        history = _KeptHistory(message.past)
        configurator = make_configurator(message.name, message.default, message.context, history)
        hosted[message.key] = _Hosted(configurator, history, [])
        return None
    if isinstance(message, _Propose):
        job = hosted[message.key]
        job.observations.extend(message.new_observations)
        config = job.configurator.propose(message.epoch, job.observations)
        return config, job.configurator.last_decision
    if isinstance(message, _Close):
        job = hosted.pop(message.key)
        job.observations.extend(message.new_observations)
        job.configurator.close(job.observations)
        return job.history.kept
    if isinstance(message, _Drop):
        hosted.pop(message.key, None)
        return None
    raise TypeError(f"unknown message {type(message).__name__}")


class ConfiguratorHost:
    """The service's configurator process: started on first use (or :meth:`start`),
    restarted after it died, stopped by :meth:`close`. Calls are serialised: one
    request and its answer at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._sequence = 0

    @classmethod
    def shared(cls) -> ConfiguratorHost:
        """This process's host: one child for every pipeline built here, stopped when
        the interpreter exits."""
        global _SHARED
        with _SHARED_LOCK:
            if _SHARED is None:
                _SHARED = cls()
                atexit.register(_SHARED.close)
            return _SHARED

    def start(self) -> None:
        """Spawn the child now (it imports while the caller goes on)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> Connection:
        if self._connection is not None and self._alive():
            return self._connection
        self._discard()
        ours, theirs = socket.socketpair()
        with theirs:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "configurator.process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
            )
        self._connection = Connection(ours.detach())
        return self._connection

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def call(self, message: Any, timeout_s: float | None = None) -> Any:
        """Send ``message`` and wait for its answer, at most ``timeout_s`` (None: as
        long as it takes). :class:`HostUnavailable` if the child died (it is restarted
        on the next call); :class:`HostTimedOut` if it did not answer in time."""
        with self._lock:
            try:
                connection = self._ensure_started()
                self._sequence += 1
                connection.send((self._sequence, message))
                status, answer = self._receive(connection, self._sequence, timeout_s)
            except (EOFError, OSError) as exc:
                self._discard()
                raise HostUnavailable(f"configurator process ended: {exc!r}") from exc
        if status == "error":
            raise HostedError(answer)
        return answer

    @staticmethod
    def _receive(connection: Connection, sequence: int, timeout_s: float | None) -> Any:
        """The answer to request ``sequence``; earlier answers, owed to callers that
        stopped waiting, are dropped."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not connection.poll(remaining):
                    raise HostTimedOut(f"configurator process gave no answer in {timeout_s:.0f} s")
            answered, status, answer = connection.recv()
            if answered == sequence:
                return status, answer

    def configurator(
        self,
        name: str,
        default: EpochConfig,
        context: JobContext | None,
        history: History | None,
    ) -> HostedConfigurator:
        """The configurator ``name`` for one job, run in the child, each answer awaited
        at most :func:`answer_timeout_s` of the job."""
        return HostedConfigurator(
            self, name, default, context, history, timeout_s=answer_timeout_s(context)
        )

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._process.pid if self._process is not None and self._alive() else None

    def close(self) -> None:
        with self._lock:
            if self._connection is not None and self._alive():
                try:
                    self._connection.send(None)
                    assert self._process is not None
                    self._process.wait(STOP_TIMEOUT_S)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._discard()

    def _discard(self) -> None:
        if self._process is not None and self._alive():
            self._process.terminate()
            self._process.wait(STOP_TIMEOUT_S)
        if self._connection is not None:
            self._connection.close()
        self._process, self._connection = None, None


_SHARED: ConfiguratorHost | None = None
_SHARED_LOCK = threading.Lock()


class HostedConfigurator(Configurator):
    """One job's configurator, deciding in the host's child process.

    Earlier jobs' observations are read here, from ``history``, and this job's are kept
    here when it closes. A dead or slow child, or a configurator that raised in it,
    costs the job its search, not the job or its deadline: the proposals fall back to
    ``default``.
    """

    def __init__(
        self,
        host: ConfiguratorHost,
        name: str,
        default: EpochConfig,
        context: JobContext | None,
        history: History | None,
        timeout_s: float | None = None,
    ) -> None:
        self.host = host
        self.name = name
        self.default = default
        self.history = history
        self.timeout_s = timeout_s
        self.last_decision: Decision | None = None
        self._key = uuid.uuid4().hex
        self._sent = 0
        self._timed_out = False
        past = history.load() if history else []
        self._open, _ = self._call(_Open(self._key, name, default, context, past))

    def _call(self, message: Any) -> tuple[bool, Any]:
        """Whether the child answered ``message`` in time, and its answer."""
        try:
            return True, self.host.call(message, self.timeout_s)
        except (HostUnavailable, HostedError) as exc:
            self._timed_out = isinstance(exc, HostTimedOut)
            log.error("configurator %s: %s; going on with the default config", self.name, exc)
            return False, None

    def _unsent(self, history: Sequence[Observation]) -> list[Observation]:
        new = list(history[self._sent :])
        self._sent = len(history)
        return new

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        self.last_decision = None
        if self._open:
            self._open, answer = self._call(_Propose(self._key, epoch, self._unsent(history)))
        if not self._open:
            return self.default
        config, self.last_decision = answer
        return config

    def close(self, history: Sequence[Observation] = ()) -> None:
        if self._timed_out:  # the child may still hold this job: let it go
            self._timed_out = False
            self._call(_Drop(self._key))
        if not self._open:
            return
        self._open = False
        answered, kept = self._call(_Close(self._key, self._unsent(history)))
        if answered and kept is not None and self.history is not None:
            self.history.save(kept)


def main(descriptor: int) -> None:
    """The child: import the numeric configurators and warm torch and gpytorch up front
    (the service started it ahead of its first job), lower its priority, then answer
    until the service closes the connection.
    Ctrl-C in a terminal reaches the whole process group: the service stops its child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import configurator.gp  # noqa: F401
    from configurator.surrogate import warm_up

    warm_up()
    os.nice(NICENESS)

    _serve(Connection(descriptor))


if __name__ == "__main__":
    # Run the package's module, not this ``__main__`` copy: the parent's messages
    # unpickle as ``configurator.process`` classes.
    from configurator import process

    process.main(int(sys.argv[1]))
