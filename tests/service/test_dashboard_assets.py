"""The dashboard's vendored kit is served by the app, byte for byte as VENDORED.md pins it."""

from __future__ import annotations

import hashlib
import re

import pytest
from fastapi.testclient import TestClient

from service.dashboard.assets import STATIC_DIR, STATIC_PREFIX


def _pinned() -> dict[str, str]:
    """File name → sha256, read from the table in VENDORED.md."""
    table = (STATIC_DIR / "vendor" / "VENDORED.md").read_text()
    return dict(re.findall(r"^\| (\S+) \| .* \| ([0-9a-f]{64}) \|$", table, re.MULTILINE))


def test_vendored_md_pins_every_vendored_file() -> None:
    on_disk = {p.name for p in (STATIC_DIR / "vendor").iterdir()} - {"VENDORED.md"}
    assert on_disk and set(_pinned()) == on_disk


@pytest.mark.parametrize("name", ["htmx.min.js", "uPlot.iife.min.js", "uPlot.min.css"])
def test_the_app_serves_each_vendored_file_with_its_pinned_checksum(
    client: TestClient, name: str
) -> None:
    response = client.get(f"{STATIC_PREFIX}/vendor/{name}")
    assert response.status_code == 200
    assert hashlib.sha256(response.content).hexdigest() == _pinned()[name]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_a_missing_static_file_is_404_not_500(client: TestClient) -> None:
    assert client.get(f"{STATIC_PREFIX}/vendor/jquery.js").status_code == 404
    assert client.get(f"{STATIC_PREFIX}/../../app.py").status_code == 404
