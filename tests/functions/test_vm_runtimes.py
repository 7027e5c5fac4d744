"""VM baselines in virtual time: sizing, scaling delays and their bills."""

from __future__ import annotations

import numpy as np
import pytest

from functions.pricing import vm_prices
from functions.runtimes.sim.vm import AutoscaledFleet, PeakSizedVm

C5 = vm_prices("c5")


def test_the_price_sets_keep_the_honest_c5_price_apart_from_the_papers() -> None:
    assert (C5.vcpus, C5.hour_usd) == (2, 0.085)
    paper = vm_prices("sandpiper")
    assert paper.hour_usd == 0.39 and paper.vcpu_hour_usd < C5.vcpu_hour_usd


def test_a_vm_is_billed_per_second_with_a_minute_minimum() -> None:
    assert C5.run_cost(1.0) == pytest.approx(C5.run_cost(60.0)) == pytest.approx(0.085 / 60)
    assert C5.run_cost(7_200.0) == pytest.approx(0.17)


def test_the_peak_sized_vm_meets_the_peak_and_is_billed_for_the_whole_trace() -> None:
    vm = PeakSizedVm.sized_for(peak_demand_vcpus=9.0, prices=C5)
    assert vm.vcpus == 10
    assert vm.finish(0.0, vcpu_seconds=100.0) == 10.0
    assert vm.bill(7_200.0) == pytest.approx(5 * 0.17)


def _flash_crowd() -> np.ndarray:
    return np.r_[np.full(1_200, 1.0), np.full(600, 12.0), np.full(1_800, 1.0)]


@pytest.mark.parametrize("slower, faster", [(60, 0), (120, 60)])
def test_a_longer_boot_delays_a_job_that_starts_in_a_flash_crowd(slower: int, faster: int) -> None:
    def finish(boot: int) -> float:
        fleet = AutoscaledFleet.track(_flash_crowd(), C5, boot_s=boot)
        return fleet.finish(1_200.0, vcpu_seconds=1_200.0)

    assert finish(slower) > finish(faster)


def test_the_fleet_scales_in_only_after_its_cooldown_and_bills_each_instance_from_launch() -> None:
    short_crowd = np.r_[np.full(1_200, 1.0), np.full(120, 12.0), np.full(1_200, 1.0)]
    fleet = AutoscaledFleet.track(short_crowd, C5, boot_s=60, cooldown_s=300)
    assert fleet.capacity[1_200 + 30] == 2  # the rise is seen at the next minute, 1,260
    assert fleet.capacity[1_320 + 30] == 18  # booted at 1,320
    assert fleet.capacity[1_500] == 18  # demand fell at 1,320; 300 s after 1,260 it may go
    assert fleet.capacity[1_600] == 2
    assert fleet.bill() == pytest.approx(sum(C5.run_cost(e - s) for s, e in fleet.runs))
    assert fleet.bill() < PeakSizedVm.sized_for(12.0, C5).bill(3_600.0)
