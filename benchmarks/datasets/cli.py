"""``driftline datasets``: where each data set is found, and fetching one into the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

__all__ = ["datasets"]

datasets = typer.Typer(help="Data sets: where each is found; fetch one into the cache.")


@datasets.command("list")
def list_datasets() -> None:
    """Each data set Driftline knows, and where a run would find it."""
    from benchmarks.datasets.registry import DATASETS, resolve

    for name, spec in DATASETS.items():
        found = resolve(name=name)
        where = found.describe() if not found.generated else "not found: the generated stream"
        fetchable = "fetchable" if spec.url else "bring your own copy"
        typer.echo(f"{name:20} {spec.title} ({fetchable}); {where}")


@datasets.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help="Data set, e.g. movielens-small.")],
    url: Annotated[str | None, typer.Option(help="A mirror of the same zip.")] = None,
    sha256: Annotated[
        str | None, typer.Option(help="The SHA-256 the mirror's zip must have.")
    ] = None,
    cache: Annotated[
        Path | None, typer.Option(help="Cache folder (default: ~/.cache/driftline/datasets).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Download even if cached.")] = False,
) -> None:
    """Download a data set, check its SHA-256 and unpack it into the cache."""
    from benchmarks.datasets.registry import FetchError, fetch

    try:
        ratings = fetch(name, cache=cache, url=url, sha256=sha256, force=force)
    except (FetchError, ValueError) as exc:
        typer.echo(f"driftline datasets fetch: {exc}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(f"{name}: {ratings}")
