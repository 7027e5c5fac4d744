"""``driftline demo --kafka`` shows the loop the HTTP demo shows: the planted inversion is
alerted, a drift job retrains, and accuracy after the onset holds up against river's.

The whole MovieLens stream at the demo's stated rate, through the embedded broker, with
no waiting for jobs (about a minute and a half on two cores).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _figure(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in the demo's output:\n{text}"
    return found.group(1)


def test_demo_through_kafka_shows_alert_drift_job_and_recovery() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "demo", "--kafka"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "COLUMNS": "240"},  # one table row per line
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    delays = [int(d.replace(",", "")) for d in re.findall(r"([\d,]+) events after the onset", out)]
    assert delays, f"no alert after the planted onset:\n{out}"
    # Alone on two cores the first alert comes about 2,000 events after the onset; with
    # the rest of the suite beside it, jobs land later in the stream and it came 15,499
    # events after (the detection delay itself is measured by ``bench drift``).
    assert min(delays) <= 25_000
    assert int(_figure(r"drift-triggered jobs\s*│\s*(\d+)", out)) >= 1
    ours = float(_figure(r"hit-rate@10 after the onset, Driftline\s*│\s*([\d.]+)", out))
    river = float(_figure(r"hit-rate@10 after the onset, river BiasedMF\s*│\s*([\d.]+)", out))
    assert ours >= 0.7 * river, (ours, river)
