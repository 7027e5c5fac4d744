"""A process built from the default settings imports what they use, not every choice.

``river.drift`` imports river's data sets, and with them scikit-learn and scipy.stats:
a large part of every start of ``driftline serve``, ``stream`` and ``consume``. The
default detector (Page-Hinkley, compiled) needs none of it; a setting that picks one of
river's own detectors imports it then (``tests/drift/test_detector_class.py``). PyTorch
and GPyTorch wait for a job's configurator in the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ["sklearn", "scipy.stats", "river.drift", "torch", "gpytorch"]

_BUILD = """
import json, sys
from pathlib import Path
from service.app import create_app
from service.settings import Settings
from service.wiring import build_driftline

settings = Settings(data_dir=Path(sys.argv[1]), drift_detector=sys.argv[2])
pipeline = build_driftline(settings, background_retrain=False)
print(json.dumps([name for name in json.loads(sys.argv[3]) if name in sys.modules]))
"""


def _imported(data_dir: Path, detector: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", _BUILD, str(data_dir), detector, json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_default_settings_build_the_service_without_the_heavy_imports(
    tmp_path: Path,
) -> None:
    assert _imported(tmp_path, "page-hinkley") == []
