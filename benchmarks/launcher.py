"""Starting ``driftline serve`` as a child process on a free loopback port.

The demo and the end-to-end tests run the real server, not an in-process app, so what
they exercise is what a user runs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(
    process: subprocess.Popen[bytes] | None, *, kill: bool = False, wait_s: float = 30.0
) -> None:
    """SIGTERM (SIGKILL with ``kill``) a child if it still runs, and reap it; one that
    does not stop within ``wait_s`` is killed."""
    if process is None or process.poll() is not None:
        return
    if kill:
        process.kill()
    else:
        process.terminate()
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerProcess:
    """A ``driftline serve`` subprocess; use as a context manager."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or data_dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "service", "serve", "--port", str(self.port)]
        command += ["--data-dir", str(self.data_dir), "--log-level", "info"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self._wait_healthy(timeout)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"driftline serve exited early; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"driftline serve not healthy after {timeout}s; see {self.log_path}")

    def stop(self, kill: bool = False) -> None:
        stop_process(self.process, kill=kill)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
