"""The garbage collector's youngest generation, as the composition root sets it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.collector import tune_collector
from service.settings import Settings
from service.wiring import build_driftline


@pytest.fixture(autouse=True)
def _thresholds_restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_young_threshold_is_set_and_the_older_generations_kept() -> None:
    gc.set_threshold(700, 11, 12)
    tune_collector(40_000)
    assert gc.get_threshold() == (40_000, 11, 12)


def test_zero_leaves_the_interpreters_setting() -> None:
    gc.set_threshold(700, 10, 10)
    tune_collector(0)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_process_built_from_settings_collects_at_their_threshold(tmp_path: Path) -> None:
    gc.set_threshold(700, 10, 10)
    settings = Settings(data_dir=tmp_path / "data", gc_young_threshold=25_000)
    pipeline = build_driftline(settings, background_retrain=False)
    try:
        assert gc.get_threshold()[0] == 25_000
    finally:
        pipeline.db.dispose()


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="gc_young_threshold"):
        Settings(gc_young_threshold=-1)
