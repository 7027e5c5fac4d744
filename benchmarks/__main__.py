"""``python -m benchmarks``: the ``driftline`` command, tooling included."""

from service.cli import app

app()
