"""Render the dashboard's pages from Jinja2 templates, autoescaped.

Every figure a page shows comes from the same functions the JSON endpoints answer with
(``/drift/alerts``, ``/jobs``, ``/models``, ``/drift/heartbeats``): the JSON stays the
source of truth and a page is one view of it. Tables are rendered on the server, so the
pages read without JavaScript; charts and live updates are added by
``static/dashboard.js`` from the JSON endpoints and ``/dashboard/events``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

__all__ = ["render", "ENVIRONMENT"]

ENVIRONMENT = Environment(
    loader=PackageLoader("service.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(epoch_seconds: float | None) -> str:
    """A Unix time as UTC, to the second; blank for None."""
    if epoch_seconds is None:
        return ""
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(epoch_seconds: float | None) -> str:
    """How long ago, in the largest whole unit; blank for None."""
    if epoch_seconds is None:
        return ""
    seconds = max(0.0, time.time() - epoch_seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _number(value: Any, digits: int = 4) -> str:
    """Floats to ``digits`` decimals, None as a dash, anything else as it prints."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _diff(interval: dict[str, Any] | None, relative: bool = True) -> str:
    """A difference with its interval: ``+0.4 % [-0.2 %, +1.0 %]`` (relative) or
    ``+0.003 [-0.010, +0.016]``; a dash for none, ``∞`` for an unbounded side."""
    if not interval or interval.get("estimate") is None:
        return "–"

    def shown(value: float | None, side: str) -> str:
        if value is None:
            return side + "∞"
        return f"{value * 100:+.1f} %" if relative else f"{value:+.3f}"

    estimate = shown(interval["estimate"], "")
    return f"{estimate} [{shown(interval.get('low'), '-')}, {shown(interval.get('high'), '+')}]"


ENVIRONMENT.filters.update(when=_when, age=_age, number=_number, diff=_diff)


def render(template: str, **context: Any) -> str:
    """The page ``template`` with ``context``; every value is escaped unless marked safe."""
    return ENVIRONMENT.get_template(template).render(**context)
