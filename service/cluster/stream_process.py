"""The stream process a serving process starts beside itself (``STREAM_PROCESS``).

``driftline serve --stream-process`` serves and folds the event log in; the child,
``driftline stream`` with the same settings, consumes Kafka, evaluates every event,
and stands for leader (drift monitor, trigger, retraining jobs). The roles share no
interpreter lock, so learning and job coordination cannot hold up ``/recommend``.

The child runs at a lower CPU priority (``STREAM_NICENESS``), and so do the worker
processes its jobs start: where cores are scarce the kernel runs ``/recommend`` first
and learning in the time left, which a separate interpreter alone cannot promise.

The child gets the parent's settings through its environment and dies with it: on
Linux the kernel kills it when the parent dies, even by ``kill -9``; a clean stop
sends it SIGTERM and waits for its jobs' grace.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable

from pydantic import SecretStr

from service.settings import Settings

log = logging.getLogger(__name__)

#: Linux's prctl option that signals a child when its parent dies.
_PR_SET_PDEATHSIG = 1


def settings_environment(settings: Settings) -> dict[str, str]:
    """``DRIFTLINE_*`` variables that rebuild ``settings`` in another process."""
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value is None:
            text = "none"
        elif isinstance(value, list | dict | tuple):
            text = json.dumps(value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[f"DRIFTLINE_{name.upper()}"] = text
    env["DRIFTLINE_STREAM_PROCESS"] = "false"
    return env


def _prepare_child(niceness: int) -> Callable[[], None]:
    def prepare() -> None:
        os.nice(niceness)
        # Not Linux: no such call, and the child outlives a killed parent.
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return prepare


class StreamProcess:
    """A running ``driftline stream`` child."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    @classmethod
    def start(cls, settings: Settings) -> StreamProcess:
        env = {key: value for key, value in os.environ.items() if not key.startswith("DRIFTLINE_")}
        env.update(settings_environment(settings))
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "stream"],
            env=env,
            preexec_fn=_prepare_child(settings.stream_niceness),  # noqa: PLW1509
        )
        log.info("stream process %d started", process.pid)
        return cls(process)

    def stop(self, grace_s: float = 35.0) -> None:
        """SIGTERM, then up to ``grace_s`` for its running job to publish."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning(
                "stream process %d did not stop in %.0f s; killed", self.process.pid, grace_s
            )
            self.process.kill()
            self.process.wait()
