"""Detectors by class name: the compiled equivalent where there is one, else river's."""

from __future__ import annotations

import pytest
import river.drift

from drift.detector_classes import detector_class
from drift.page_hinkley import PageHinkley


def test_page_hinkley_is_the_compiled_one_and_other_names_are_rivers() -> None:
    assert detector_class("PageHinkley") is PageHinkley
    assert detector_class("ADWIN") is river.drift.ADWIN
    assert detector_class("KSWIN") is river.drift.KSWIN


@pytest.mark.parametrize("name", ["Nope", "datasets", "adwin"])
def test_a_name_river_has_no_detector_for_is_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"river.drift has no detector '{name}'"):
        detector_class(name)
