"""Access control on a real ``driftline serve`` on loopback, under concurrent clients.

Keys are created with the CLI before the server starts, as an operator would; clients
with each scope, without a key and with a foreign Host header call the server at once,
and a key revoked with ``driftline keys revoke`` (another process) stops working while
the server runs.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess

pytestmark = pytest.mark.slow


def _key(data_dir: Path, name: str, scope: str) -> str:
    command = [sys.executable, "-m", "service", "keys", "create", name, "--scope", scope]
    done = subprocess.run(
        [*command, "--data-dir", str(data_dir)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


#: (caller, method, path, body) and the status each must get.
CALLS = [
    ("feeder", "POST", "/ingest", True, 200),
    ("feeder", "GET", "/models", False, 403),
    ("reader", "GET", "/recommend?user_id=u1", False, 200),
    ("reader", "POST", "/retrain", False, 403),
    ("anonymous", "GET", "/jobs", False, 401),
    ("anonymous", "POST", "/ingest", True, 401),
    ("anonymous", "GET", "/healthz", False, 200),
    ("rebinding", "GET", "/models", False, 400),
]


def test_concurrent_clients_get_what_their_keys_allow_and_revocation_is_live(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    tokens = {
        "feeder": _key(data_dir, "feeder", "ingest"),
        "reader": _key(data_dir, "reader", "read"),
        "doomed": _key(data_dir, "doomed", "read"),
    }
    env = {"DRIFTLINE_KEY_REFRESH_SECONDS": "0.2", "DRIFTLINE_RETRAIN_ENABLED": "false"}
    wrong: list[str] = []
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def client(number: int, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            for round_ in range(15):
                for caller, method, path, body, expected in CALLS:
                    headers = {}
                    if caller in tokens:
                        headers["Authorization"] = f"Bearer {tokens[caller]}"
                    if caller == "rebinding":
                        headers["Host"] = "attacker.example"
                    events = [{"user_id": f"u{number}", "item_id": f"i{round_}", "rating": 4.0}]
                    answer = http.request(
                        method, path, headers=headers, json={"events": events} if body else None
                    )
                    with lock:
                        seen[answer.status_code] += 1
                        if answer.status_code != expected:
                            wrong.append(f"{caller} {method} {path}: {answer.status_code}")

    with ServerProcess(data_dir, env=env) as server:
        doomed = {"Authorization": f"Bearer {tokens['doomed']}"}
        assert httpx.get(f"{server.url}/models", headers=doomed).status_code == 200
        threads = [threading.Thread(target=client, args=(n, server.url)) for n in range(4)]
        for thread in threads:
            thread.start()
        revoke = [sys.executable, "-m", "service", "keys", "revoke", "doomed"]
        subprocess.run([*revoke, "--data-dir", str(data_dir)], check=True, capture_output=True)
        revoked_at = time.monotonic()
        while httpx.get(f"{server.url}/models", headers=doomed).status_code == 200:
            assert time.monotonic() - revoked_at < 5, "the revoked key still works"
            time.sleep(0.05)
        for thread in threads:
            thread.join(timeout=120)
        assert httpx.get(f"{server.url}/models", headers=doomed).status_code == 401
        stored = httpx.get(f"{server.url}/healthz").json()["events_stored"]
    assert wrong == []
    assert not any(code >= 500 for code in seen), seen
    assert stored == 4 * 15  # one event per feeder call, nothing from anyone else
