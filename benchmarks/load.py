"""Closed-loop HTTP load with ``wrk``: random users against ``GET /recommend``.

``wrk`` (Debian's and Homebrew's package ``wrk``) keeps ``connections`` requests in
flight from ``threads`` native threads with epoll, so on a 2-core machine it costs the
server far less CPU than any Python load generator would; a Lua script picks a random
user for every request and prints the figures as JSON when the run ends. Latencies are
wrk's own histogram (closed loop: a slow answer delays the next request on its
connection, as it does for real clients that wait).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

INSTALL_HINT = (
    "wrk is not installed: the serving benchmark drives both servers with it. Install "
    "it with `apt-get install wrk` (Debian, Ubuntu) or `brew install wrk` (macOS)."
)

_SCRIPT = """
local users = {%(users)s}
local headers = {%(headers)s}
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end
function init(args)
  math.randomseed(%(seed)d + id)
end
function request()
  local user = users[math.random(#users)]
  return wrk.format("GET", "%(path)s?user_id=" .. user .. "&k=%(k)d", headers)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK_JSON {"requests": %%d, "duration_us": %%d, "non_2xx": %%d, "connect_errors": %%d,'
    .. ' "read_errors": %%d, "write_errors": %%d, "timeouts": %%d, "p50_us": %%d,'
    .. ' "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


class LoadGeneratorMissing(RuntimeError):
    """wrk is not on PATH."""


@dataclass(frozen=True)
class LoadResult:
    """What one wrk run measured."""

    requests: int
    seconds: float
    non_2xx: int
    socket_errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def require_wrk() -> str:
    """The path of ``wrk``, or ``LoadGeneratorMissing`` saying how to install it."""
    path = shutil.which("wrk")
    if path is None:
        raise LoadGeneratorMissing(INSTALL_HINT)
    return path


def drive(
    url: str,
    users: list[str],
    *,
    seconds: float,
    connections: int = 32,
    threads: int = 2,
    k: int = 10,
    api_key: str | None = None,
    seed: int = 0,
) -> LoadResult:
    """``GET {url}/recommend?user_id=U&k=K`` for random users in ``users`` for ``seconds``."""
    wrk = require_wrk()
    quoted = ",".join(json.dumps(quote(user, safe="")) for user in users)
    headers = f'["Authorization"] = "Bearer {api_key}"' if api_key else ""
    values = {"users": quoted, "headers": headers, "seed": seed, "path": "/recommend", "k": k}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(_SCRIPT % values)
        script_path = Path(handle.name)
    try:
        command = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s"]
        command += ["--timeout", "10s", "-s", str(script_path), url]
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    finally:
        script_path.unlink(missing_ok=True)
    return _parse(done.stdout, done.stderr)


def _parse(stdout: str, stderr: str) -> LoadResult:
    for line in stdout.splitlines():
        if line.startswith("WRK_JSON "):
            raw = json.loads(line.removeprefix("WRK_JSON "))
            errors = raw["connect_errors"] + raw["read_errors"] + raw["write_errors"]
            return LoadResult(
                requests=raw["requests"],
                seconds=raw["duration_us"] / 1e6,
                non_2xx=raw["non_2xx"],
                socket_errors=errors + raw["timeouts"],
                p50_ms=raw["p50_us"] / 1000,
                p90_ms=raw["p90_us"] / 1000,
                p99_ms=raw["p99_us"] / 1000,
                max_ms=raw["max_us"] / 1000,
            )
    raise RuntimeError(f"wrk printed no figures:\n{stdout}\n{stderr}")
