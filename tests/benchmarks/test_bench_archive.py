"""``driftline bench archive``: the stored sample and the partitions give the same draw."""

from __future__ import annotations

from benchmarks.bench.archive import run_archive


def test_the_archive_benchmark_draws_the_same_events_both_ways() -> None:
    figures = run_archive(events=12_000, partition_rows=2_000, history_sample=500)
    assert figures["same_events"] is True
    # The newest partition_rows stay in the table; the rest is archived in partitions.
    assert figures["archived_events"] == 10_000 and figures["partitions"] == 5
    assert figures["sample_object_bytes"] > 0 and figures["sample_upkeep_s"] > 0
    assert figures["draw_from_sample_s"] > 0 and figures["draw_from_partitions_s"] > 0
