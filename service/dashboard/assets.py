"""Serve the dashboard's static files (the vendored kit and our own script) from the package.

The files are public code, so they are mounted outside the routes' access check: a
browser fetches them before it has signed in, and they reveal nothing about the service.
They are read from the installed package, so a wheel install serves the same bytes that
``static/vendor/VENDORED.md`` pins.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "STATIC_PREFIX", "mount_static"]

#: The folder shipped in the wheel (pyproject's package-data).
STATIC_DIR = Path(__file__).parent / "static"
#: Where pages link the files from; under /dashboard so one reverse-proxy rule covers both.
STATIC_PREFIX = "/dashboard/static"


def mount_static(app: FastAPI) -> None:
    """Serve ``STATIC_DIR`` under ``STATIC_PREFIX``."""
    app.mount(STATIC_PREFIX, StaticFiles(directory=STATIC_DIR), name="dashboard-static")
