"""What makes an event acceptable, for every way events arrive (HTTP and Kafka).

One definition, so a message the consumer accepts is exactly an event ``POST /ingest``
would accept, and the errors name the same fields.

Two ways to apply it. ``parse_batch`` checks a whole batch of decoded events a column at
a time (types, lengths and refused characters of every id at once, ratings and
timestamps as arrays): about a tenth of what validating each event through ``EventIn``
costs, and it accepts only events ``EventIn`` accepts. When it finds anything it is not
sure of, it says so (None), and the batch goes through ``parse_event`` one event at a
time, which names each problem.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictFloat, StringConstraints, ValidationError

from service.settings.limits import EventLimits, Problem
from service.store.events import NewEvent

#: What an id may hold: any text but control characters and invisible formatting marks.
#: NUL because PostgreSQL's text columns refuse it (a stored event must be storable on
#: either database, and a Kafka message with one must become a dead letter rather than
#: stop the consumer); the other C0/C1 controls because they rewrite terminals and logs;
#: the bidirectional overrides and isolates (U+061C, U+200E/F, U+202A–E, U+2066–9), the
#: zero-width marks (U+200B–D, U+2060, U+FEFF) and the line/paragraph separators
#: (U+2028/9) because they make two different ids look the same to an operator, or one id
#: read backwards ("Trojan Source", CVE-2021-42574). Matched inside pydantic-core, so it
#: costs the ingest path no Python call per id; ``GET /recommend`` applies it to
#: ``user_id``.
_REFUSED_CHARACTERS = r"\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
IDENTIFIER_PATTERN = f"^[^{_REFUSED_CHARACTERS}]*$"
#: Any one refused character, looked for in a whole batch's ids at once.
_REFUSED = re.compile(f"[{_REFUSED_CHARACTERS}]")
#: What a refused id is told, instead of the pattern above.
IDENTIFIER_RULE = "must not hold control characters or bidirectional or zero-width marks"
IDENTIFIER_MAX_LENGTH = 256
Identifier = Annotated[
    str,
    StringConstraints(
        strict=True, min_length=1, max_length=IDENTIFIER_MAX_LENGTH, pattern=IDENTIFIER_PATTERN
    ),
]
# Strict: a JSON number (int or float), never a numeric string or a boolean.
Number = StrictFloat


class EventIn(BaseModel):
    """One event as a client sends it; unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")

    event_id: Identifier | None = None
    user_id: Identifier
    item_id: Identifier
    rating: Number | None = None
    timestamp: Number | None = None

    def range_errors(self, limits: EventLimits) -> list[Problem]:
        """Values that parse but are not acceptable."""
        rating_min, rating_max = limits.rating_min, limits.rating_max
        errors: list[Problem] = []
        if self.rating is not None:
            if not math.isfinite(self.rating):
                errors.append(
                    Problem("rating", f"rating must be a finite number, got {self.rating}")
                )
            elif not rating_min <= self.rating <= rating_max:
                errors.append(
                    Problem("rating", f"rating {self.rating} is outside {rating_min}..{rating_max}")
                )
        if self.timestamp is not None:
            errors.extend(limits.timestamp_errors(self.timestamp))
        return errors


def parse_event(raw: Any, limits: EventLimits) -> tuple[NewEvent | None, list[Problem]]:
    """The event in ``raw`` (a decoded JSON value), or None and why not."""
    try:
        event = EventIn.model_validate(raw)
    except ValidationError as exc:
        return None, [_problem(error) for error in exc.errors()]
    return _checked(event, limits)


def parse_event_json(
    data: bytes | str, limits: EventLimits
) -> tuple[NewEvent | None, list[Problem]]:
    """The event in a JSON document, or None and why not.

    Parsing and validating in one pass (in pydantic-core) is about three times faster
    than ``json.loads`` followed by validation, which matters on the Kafka path.
    """
    try:
        event = EventIn.model_validate_json(data)
    except ValidationError as exc:
        return None, [_problem(error) for error in exc.errors()]
    return _checked(event, limits)


def _checked(event: EventIn, limits: EventLimits) -> tuple[NewEvent | None, list[Problem]]:
    problems = event.range_errors(limits)
    if problems:
        return None, problems
    return (
        NewEvent(
            user_id=event.user_id,
            item_id=event.item_id,
            rating=None if event.rating is None else float(event.rating),
            timestamp=None if event.timestamp is None else float(event.timestamp),
            event_id=event.event_id,
        ),
        [],
    )


def _problem(error: Any) -> Problem:
    location = ".".join(str(part) for part in error["loc"])
    field = str(error["loc"][0]) if error["loc"] else "event"
    message = IDENTIFIER_RULE if error["type"] == "string_pattern_mismatch" else error["msg"]
    return Problem(field, f"{location or 'event'}: {message}")


_FIELDS = frozenset(EventIn.model_fields)


def parse_batch(
    raws: Sequence[Any],
    limits: EventLimits,
    fallback_id: Callable[[int], str] | None = None,
) -> list[NewEvent] | None:
    """The events of ``raws`` (decoded JSON values) if every one is acceptable as it
    stands, else None: then ``parse_event`` on each says which are not, and why.
    ``fallback_id(position)`` names an event that carries no id (the Kafka consumer's
    record id); without it such events have no id.

    Checked a column at a time, in C loops: each event an object with known fields and
    both ids; every id a string of 1 to 256 characters, none refused (one regular
    expression search over all ids joined); ratings and timestamps numbers (never
    booleans), finite and within the limits (as arrays). What passes is exactly what
    ``EventIn`` and its range checks accept, so an event never depends on how it came.

    Examples
    --------
    >>> limits = EventLimits(timestamp_min=0.0)
    >>> parse_batch([{"user_id": "u1", "item_id": "i9", "rating": 4}], limits)
    [NewEvent(user_id='u1', item_id='i9', rating=4.0, timestamp=None, event_id=None)]
    >>> parse_batch([{"user_id": "u1", "item_id": "i9", "rating": 9.0}], limits) is None
    True
    """
    if not set(map(type, raws)) <= {dict} or not set().union(*raws) <= _FIELDS:
        return None
    try:
        users = [raw["user_id"] for raw in raws]
        items = [raw["item_id"] for raw in raws]
    except KeyError:
        return None
    event_ids = [raw.get("event_id") for raw in raws]
    ratings = [raw.get("rating") for raw in raws]
    timestamps = [raw.get("timestamp") for raw in raws]
    given_ids = [event_id for event_id in event_ids if event_id is not None]
    latest = time.time() + limits.timestamp_ahead_seconds
    if not (
        _plain_identifiers(users)
        and _plain_identifiers(items)
        and _plain_identifiers(given_ids)
        and _numbers_within(ratings, limits.rating_min, limits.rating_max)
        and _numbers_within(timestamps, limits.timestamp_min, latest)
    ):
        return None
    if fallback_id is not None and len(given_ids) < len(event_ids):
        event_ids = [
            given if given is not None else fallback_id(at) for at, given in enumerate(event_ids)
        ]
    return NewEvent.columns(users, items, _floats(ratings), _floats(timestamps), event_ids)


def _floats(values: list[Any]) -> list[float | None]:
    """Checked JSON numbers as floats (None stays None)."""
    if None in values:
        return [None if value is None else float(value) for value in values]
    return list(map(float, values))


def _plain_identifiers(values: list[Any]) -> bool:
    """Whether every value is an ``Identifier``: a string (not a subclass) of allowed
    length without a refused character."""
    if not values:
        return True
    if not set(map(type, values)) <= {str}:
        return False
    lengths = list(map(len, values))
    if min(lengths) < 1 or max(lengths) > IDENTIFIER_MAX_LENGTH:
        return False
    return _REFUSED.search("".join(values)) is None


def _numbers_within(values: list[Any], low: float, high: float) -> bool:
    """Whether every value is None or a finite JSON number in ``low..high``."""
    numbers = [value for value in values if value is not None]
    if not numbers:
        return True
    if not set(map(type, numbers)) <= {float, int}:  # bool is neither
        return False
    try:
        array = np.array(numbers, dtype=np.float64)
    except OverflowError:  # an integer no double holds
        return False
    return bool((np.isfinite(array) & (array >= low) & (array <= high)).all())
