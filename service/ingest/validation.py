"""What makes an event acceptable, for every way events arrive (HTTP and Kafka).

One definition, so a message the consumer accepts is exactly an event ``POST /ingest``
would accept, and the errors name the same fields.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

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
IDENTIFIER_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]*$"
#: What a refused id is told, instead of the pattern above.
IDENTIFIER_RULE = "must not hold control characters or bidirectional or zero-width marks"
Identifier = Annotated[
    str,
    StringConstraints(strict=True, min_length=1, max_length=256, pattern=IDENTIFIER_PATTERN),
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
