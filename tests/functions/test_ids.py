"""A batch's ``Ids``: the same codes and rows as plain look-ups, each look-up done once."""

from __future__ import annotations

import numpy as np
import pytest

from drift.batch_ids import distinct as drift_distinct
from drift.heartbeat import UserKeys, user_key
from drift.segments import _Codes
from functions.ids import Ids, codes_through, distinct
from functions.mf_rows import IdRows

RNG = np.random.default_rng(7)
USERS = [f"u{k}" for k in RNG.integers(0, 12, 500)]
ITEMS = [f"i{k}" for k in RNG.integers(0, 400, 500)]


@pytest.mark.parametrize("repeated", [True, False])
def test_ids_factorize_and_look_up_as_plain_sequences_do(repeated: bool) -> None:
    ids = Ids.of(USERS, repeated=repeated)
    first, codes = distinct(ids)
    assert first == list(dict.fromkeys(USERS))
    assert [first[c] for c in codes.tolist()] == USERS
    assert distinct(ids) is distinct(ids)  # computed once
    assert drift_distinct(ids) == distinct(ids) and drift_distinct(USERS)[0] == first
    np.testing.assert_array_equal(drift_distinct(USERS)[1], codes)
    with pytest.raises(ValueError):
        codes[0] = 1  # shared, so read-only
    table = {user: k for k, user in enumerate(first[::2])}
    expected = [table.get(user, -1) for user in USERS]
    assert codes_through(ids, table.get).tolist() == expected
    assert codes_through(USERS, table.get).tolist() == expected


def test_a_table_s_rows_are_looked_up_once_per_size_and_again_when_it_grows() -> None:
    rows = IdRows(2)
    rows.append(list(dict.fromkeys(ITEMS[:250])), np.zeros((len(set(ITEMS[:250])), 2)))
    ids = Ids.of(ITEMS, repeated=False)
    before = rows.encode(ids)
    assert rows.encode(ids) is before
    assert before.tolist() == rows.encode(list(ITEMS)).tolist()
    new = [item for item in dict.fromkeys(ITEMS) if item not in rows.index]
    rows.append(new, np.zeros((len(new), 2)))
    after = rows.encode(ids)
    assert after is not before and (after >= 0).all()
    assert after.tolist() == rows.encode(list(ITEMS)).tolist()


def test_drift_s_codes_and_user_keys_match_for_ids_and_plain_lists() -> None:
    for ids in (Ids.of(USERS, repeated=True), USERS):
        codes = _Codes()
        codes.encode(USERS[:100])
        assert codes.encode(ids).tolist() == _reference_codes(USERS[:100], USERS)
        assert UserKeys()(ids).tolist() == [user_key(user) for user in USERS]


def _reference_codes(earlier: list[str], batch: list[str]) -> list[int]:
    """Codes by first sight of each batch, each batch's new ids in sorted order."""
    names: dict[str, int] = {}
    for part in (earlier, batch):
        for name in sorted(set(part) - set(names)):
            names[name] = len(names)
    return [names[name] for name in batch]
