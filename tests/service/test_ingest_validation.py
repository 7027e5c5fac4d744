"""Event validation (``service.ingest.validation``) and the Kafka consumer's decoding.

``parse_batch`` checks a batch a column at a time and must accept exactly the batches
whose every event ``parse_event`` accepts, with the same events; a batch it refuses is
parsed one event at a time, so the errors a client or a dead letter sees never change.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ingest.kafka import decode
from service.ingest.validation import parse_batch, parse_event
from service.settings.limits import EventLimits
from service.store.events import NewEvent

LIMITS = EventLimits()
NOW = time.time()

identifiers = st.one_of(
    st.sampled_from(["u1", "item-9", "é", "x" * 256]),
    st.text(max_size=4),  # the empty string and refused characters among them
    st.sampled_from(["", "x" * 257, "a\x00b", "a\u202eb", "a\ufeff", "a\nb", "\x7f", "\u2066"]),
    st.integers(-3, 3),
    st.booleans(),
    st.none(),
    st.lists(st.just("u"), max_size=1),
)
numbers = st.one_of(
    st.sampled_from([0.5, 5.0, 3, 4.5, NOW - 60, NOW, 631_152_000.0, 700_000_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.sampled_from(["4.0", 0.49, 5.01, NOW + 2 * 86_400]),
)
events = st.one_of(
    st.fixed_dictionaries(
        {"user_id": identifiers, "item_id": identifiers},
        optional={
            "event_id": identifiers,
            "rating": numbers,
            "timestamp": numbers,
            "ratng": numbers,
        },
    ),
    st.sampled_from([None, [], "event", 7, {}]),
)
plain_events = st.fixed_dictionaries(
    {"user_id": st.sampled_from(["u1", "u2"]), "item_id": st.sampled_from(["i1", "i2"])},
    optional={
        "event_id": st.sampled_from(["e1", "e2", None]),
        "rating": st.sampled_from([0.5, 3, 4.5, 5.0, None]),
        "timestamp": st.sampled_from([NOW - 3600.0, 1_000_000_000, None]),
    },
)


def one_at_a_time(raws: list[Any]) -> list[NewEvent] | None:
    parsed = [parse_event(raw, LIMITS)[0] for raw in raws]
    accepted = [event for event in parsed if event is not None]
    return accepted if len(accepted) == len(parsed) else None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(events, plain_events), max_size=4))
def test_a_batch_is_accepted_whole_exactly_when_every_event_is_acceptable(
    raws: list[Any],
) -> None:
    assert parse_batch(raws, LIMITS) == one_at_a_time(raws)


@settings(max_examples=100, deadline=None)
@given(st.lists(plain_events, min_size=1, max_size=20))
def test_plain_batches_pass_the_batch_check(raws: list[Any]) -> None:
    batch = parse_batch(raws, LIMITS)
    assert batch is not None
    assert batch == one_at_a_time(raws)
    assert all(e.rating is None or type(e.rating) is float for e in batch)


def test_an_empty_batch_is_no_events() -> None:
    assert parse_batch([], LIMITS) == []


@settings(max_examples=100, deadline=None)
@given(st.lists(plain_events, min_size=1, max_size=20))
def test_fallback_ids_name_only_the_events_that_carry_none(raws: list[Any]) -> None:
    fallbacks = [f"topic-0-{offset}" for offset in range(len(raws))]
    batch = parse_batch(raws, LIMITS, fallbacks.__getitem__)
    assert batch is not None
    expected = one_at_a_time(raws)
    assert expected is not None
    assert batch == [
        event if event.event_id is not None else replace(event, event_id=fallback)
        for event, fallback in zip(expected, fallbacks, strict=True)
    ]
    assert all(type(event) is NewEvent and type(event.user_id) is str for event in batch)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), 10**400, True],
    ids=["nan", "inf", "-inf", "10^400", "true"],
)
def test_values_only_pythons_json_parser_yields_are_left_to_the_precise_errors(
    value: Any,
) -> None:
    # /ingest falls back to json.loads for NaN and Infinity literals and huge integers.
    raw = {"user_id": "u", "item_id": "i", "rating": value}
    assert parse_batch([raw], LIMITS) is None
    assert parse_event(raw, LIMITS)[0] is None


# -- the Kafka consumer's decoding ------------------------------------------------------


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None


def _records(values: Sequence[bytes | None]) -> list[Record]:
    return [Record(k % 2, 10 + k, value) for k, value in enumerate(values)]


def test_a_poll_of_valid_messages_decodes_whole_with_offsets_and_generated_ids() -> None:
    values = [
        orjson.dumps({"event_id": "e0", "user_id": "u", "item_id": "i", "rating": 4}),
        json.dumps({"user_id": "v", "item_id": "j", "timestamp": NOW}).encode(),
        b'{"user_id": "w", "item_id": "k", "rating": null}',
    ]
    decoded = decode("events", _records(values), LIMITS)
    assert decoded.dead == []
    assert decoded.events == [
        NewEvent("u", "i", 4.0, None, "e0"),
        NewEvent("v", "j", None, NOW, "events-1-11"),
        NewEvent("w", "k", None, None, "events-0-12"),
    ]
    assert decoded.next_offsets == {0: 13, 1: 12}


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (None, "message has no value"),
        (b"{not json", "event: event: Invalid JSON"),
        (b'{"user_id": "u", "item_id": "i", "rating": NaN}', "rating: rating must be a finite"),
        (b'{"user_id": "u", "item_id": "i", "rating": 7}', "rating: rating 7.0 is outside"),
        (b'{"user_id": "u\\u0000", "item_id": "i"}', "user_id: user_id: must not hold"),
        (b'{"user_id": "u"}', "item_id: item_id: Field required"),
        (b"[1]", "event: event: Input should be an object"),
    ],
    ids=["no-value", "not-json", "nan", "range", "nul", "missing", "array"],
)
def test_a_bad_message_becomes_a_dead_letter_and_the_rest_of_its_poll_is_stored(
    bad: bytes | None, reason: str
) -> None:
    values = [b'{"user_id": "u", "item_id": "i"}', bad, b'{"user_id": "v", "item_id": "j"}']
    decoded = decode("events", _records(values), LIMITS)
    assert [(e.user_id, e.event_id) for e in decoded.events] == [
        ("u", "events-0-10"),
        ("v", "events-0-12"),
    ]
    assert [(d.partition, d.offset, d.value) for d in decoded.dead] == [(1, 11, bad)]
    assert decoded.dead[0].error.startswith(reason), decoded.dead[0].error
    assert decoded.next_offsets == {0: 13, 1: 12}
    assert not math.isnan(sum(e.rating or 0.0 for e in decoded.events))
