"""``IdCodes``: integer codes for a process's ids, and tables' look-ups kept by code.

Every table on the ingest path takes a batch's items by code; the answers must be the
plain look-ups' whatever the table did in between (grew, gave rows away, was renumbered)
and across the codes starting afresh.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from drift.ranking import RankingSampler, sample_point
from drift.segments import SegmentBuffer, _Codes
from functions.ids import IdCodes, Ids, look_up
from functions.mf_rows import IdRows
from service.serving.popular import PopularItems
from service.serving.rows import LruRows

RNG = np.random.default_rng(11)


def _batches(count: int, size: int, catalogue: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[f"i{k}" for k in rng.integers(0, catalogue, size)] for _ in range(count)]


def test_codes_are_given_in_order_of_first_sight_and_start_afresh_past_the_limit() -> None:
    codes = IdCodes(limit=4)
    assert codes.encode(["b", "a", "b"]).tolist() == [0, 1, 0]
    assert codes.encode(["c", "a"]).tolist() == [2, 1] and codes.generation == 0
    assert codes.encode(["d", "e", "a"]).tolist() == [0, 1, 2]  # five ids: afresh
    assert codes.generation == 1 and len(codes) == 3
    with pytest.raises(ValueError):
        IdCodes(limit=0)


@pytest.mark.parametrize("limit", [50, 100_000])
def test_a_growing_table_answers_as_its_dictionary_does_batch_after_batch(limit: int) -> None:
    codes, table = IdCodes(limit=limit), IdRows(1)
    for batch in _batches(40, 60, 120):
        ids = Ids.of(batch, repeated=False, codes=codes)
        expected = [table.index.get(item, -1) for item in batch]
        assert table.encode(ids).tolist() == expected
        new = table.new_ids(batch[:7])  # grows after some of its absences were kept
        table.append(new, np.zeros((len(new), 1)))
        again = Ids.of(batch, repeated=False, codes=codes)
        assert table.encode(again).tolist() == [table.index[item] for item in batch[:7]] + [
            table.index.get(item, -1) for item in batch[7:]
        ]


def test_a_table_that_gives_rows_away_is_answered_afresh_for_them() -> None:
    codes = IdCodes()
    index = {"a": 0, "b": 1}
    table = object.__new__(LruRows)  # any weakly referenceable table will do

    def rows(batch: list[str]) -> list[int]:
        return look_up(Ids.of(batch, repeated=False, codes=codes), table, index.get).tolist()

    assert rows(["a", "b", "c"]) == [0, 1, -1]
    del index["a"]
    codes.forget(table, ["a"])
    index["c"] = 0
    assert rows(["a", "b", "c"]) == [-1, 1, 0]
    index.clear()
    codes.drop(table)
    assert rows(["a", "b", "c"]) == [-1, -1, -1]


def test_a_table_s_kept_rows_go_with_it() -> None:
    codes = IdCodes()
    table = IdRows(1)
    table.append(["a"], np.zeros((1, 1)))
    table.encode(Ids.of(["a"], repeated=False, codes=codes))
    assert len(codes._found) == 1
    del table
    gc.collect()
    assert len(codes._found) == 0


def test_ids_coded_before_the_codes_started_afresh_are_looked_up_by_string() -> None:
    codes, table = IdCodes(limit=3), IdRows(1)
    table.append(["a", "b", "x"], np.zeros((3, 1)))
    old = Ids.of(["a", "b"], repeated=False, codes=codes)
    assert table.encode(old).tolist() == [0, 1]
    Ids.of(["c", "d"], repeated=False, codes=codes).look_up(table, table.index.get)
    assert codes.generation == 1
    assert table.encode(Ids.of(["x", "a"], repeated=False, codes=codes)).tolist() == [2, 0]
    assert old.look_up(table, table.index.get).tolist() == [0, 1]


@pytest.mark.parametrize("limit", [30, 100_000])
def test_bounded_rows_evicting_items_match_rows_fed_strings(limit: int) -> None:
    codes = IdCodes(limit=limit)
    coded, plain = LruRows({"x": ()}, limit=25), LruRows({"x": ()}, limit=25)
    for batch in _batches(60, 20, 80, seed=3):
        ours = coded.rows_for(Ids.of(batch, repeated=False, codes=codes))
        assert ours.tolist() == plain.rows_for(list(batch)).tolist()
        assert coded.evict() == plain.evict()
    assert coded.index == plain.index


def test_popular_items_fed_coded_ids_rank_as_when_fed_strings() -> None:
    codes = IdCodes(limit=40)
    coded, plain = PopularItems(window=150), PopularItems(window=150)
    users = _batches(50, 30, 15, seed=5)
    for people, items in zip(users, _batches(50, 30, 70, seed=6), strict=True):
        coded.add(Ids.of(people, repeated=True), Ids.of(items, repeated=False, codes=codes))
        plain.add(people, items)
        assert coded.ranking == plain.ranking


def test_segment_codes_fed_coded_ids_match_through_compaction() -> None:
    codes = IdCodes(limit=60)
    coded, plain = SegmentBuffer(capacity=40), SegmentBuffer(capacity=40)
    after = 0
    for batch in _batches(30, 25, 200, seed=8):
        errors = RNG.random(len(batch))
        users = [f"u{k % 7}" for k in range(len(batch))]
        coded.record(users, Ids.of(batch, repeated=False, codes=codes), errors, after=after)
        plain.record(users, batch, errors, after=after)
        after += len(batch)
        assert coded._item_counts == plain._item_counts
    assert coded.report(after // 2) == plain.report(after // 2)
    table = _Codes()
    assert table.encode(Ids.of(["b", "a"], repeated=False, codes=codes)).tolist() == [1, 0]


def test_sample_points_from_coded_ids_are_each_event_s_own() -> None:
    codes = IdCodes(limit=50)
    sampler = RankingSampler(fraction=0.3)
    for seed, batch in enumerate(_batches(20, 40, 90, seed=9)):
        users = [f"u{k}" for k in np.random.default_rng(seed).integers(0, 5, len(batch))]
        stamps = [float(1_000 + seed * 100 + j) for j in range(len(batch))]
        points = sampler.points(
            Ids.of(users, repeated=True), Ids.of(batch, repeated=False, codes=codes), stamps
        )
        expected = [sample_point(*event) for event in zip(users, batch, stamps, strict=True)]
        assert points.tolist() == expected
