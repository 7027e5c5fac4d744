"""``driftline demo --kafka`` runs the loop the HTTP demo runs: the stream through the
embedded broker, retrained versions serving within it, and accuracy after the planted
inversion that holds up against river's.

The whole MovieLens stream at the demo's stated rate, with no waiting for jobs (about a
minute and a half on two cores). Whether the inversion raises an alert here depends on
which version serves at the onset, and so on how fast jobs run beside the rest of the
suite: with the fold-in on, the inversion moves the live error only a few per cent. The
alert, the drift job and the served retrained version are asserted where the stream
controls them, in ``tests/e2e/test_drift_inversion.py``; detection delay is measured by
``bench drift``."""

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


def test_demo_through_kafka_retrains_within_the_stream_and_keeps_up_after_the_onset() -> None:
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
    assert int(_figure(r"model versions\s*│\s*(\d+)", out)) >= 2, out
    assert _figure(r"serving model\s*│\s*(v\d+)", out) != "v0001", out
    ours = float(_figure(r"RMSE after the onset, Driftline\s*│\s*([\d.]+)", out))
    river = float(_figure(r"RMSE after the onset, river BiasedMF\s*│\s*([\d.]+)", out))
    assert ours <= 1.05 * river, (ours, river)
    ours = float(_figure(r"hit-rate@10 after the onset, Driftline\s*│\s*([\d.]+)", out))
    river = float(_figure(r"hit-rate@10 after the onset, river BiasedMF\s*│\s*([\d.]+)", out))
    assert ours >= 0.7 * river, (ours, river)
