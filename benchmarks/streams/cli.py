"""``driftline generate``: a generated stream to a file, Kafka or ``POST /ingest``.

The command is registered by ``benchmarks.cli``; the generator itself is imported only
when it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["generate"]


def _format(output: Path | None, given: str | None) -> str:
    if given is not None:
        if given not in ("csv", "ndjson"):
            raise typer.BadParameter(f"unknown format {given!r}; choose csv or ndjson")
        return given
    suffixes = output.suffixes if output is not None else []
    return "ndjson" if {".ndjson", ".jsonl", ".json"} & set(suffixes) else "csv"


def _truth_path(output: Path | None, given: Path | None) -> Path | None:
    if given is not None or output is None or str(output) == "-":
        return given
    name = output.name.split(".")[0] or "stream"
    return output.with_name(f"{name}.truth.json")


def generate(
    events: Annotated[int, typer.Option(min=1, help="Number of events.")] = 100_000,
    seed: Annotated[int, typer.Option(min=0, help="The same seed gives the same stream.")] = 0,
    to: Annotated[str, typer.Option(help="file, kafka or http (POST /ingest).")] = "file",
    output: Annotated[
        Path | None, typer.Option(help="--to file: path (.csv, .ndjson, .gz; - for stdout).")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", help="csv or ndjson (default: by suffix).")
    ] = None,
    truth: Annotated[
        Path | None,
        typer.Option(help="Ground truth JSON (default: NAME.truth.json beside the file)."),
    ] = None,
    trace: Annotated[
        str, typer.Option(help="Arrivals: constant, wiki, berkeley, twitter, wits.")
    ] = "constant",
    rate: Annotated[
        float | None, typer.Option(help="Events per second of the constant trace (1000).")
    ] = None,
    speed: Annotated[float, typer.Option(help="Play the trace X times faster.")] = 1.0,
    regular: Annotated[
        bool, typer.Option("--regular", help="Each event exactly when due, not Poisson.")
    ] = False,
    drift: Annotated[
        str | None, typer.Option(help="Plant sudden, gradual, item_shift or new_cohort.")
    ] = None,
    drift_at: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Onset as a fraction of the stream.")
    ] = 0.6,
    drift_share: Annotated[
        float | None, typer.Option(help="Share of users (items) the drift affects.")
    ] = None,
    drift_ramp: Annotated[int | None, typer.Option(help="gradual: events to ramp in.")] = None,
    drift_shift: Annotated[
        float | None, typer.Option(help="item_shift: stars the items fall by.")
    ] = None,
    active_users: Annotated[
        int | None, typer.Option(min=1, help="Users active at once (default: the fit's).")
    ] = None,
    items: Annotated[
        int | None, typer.Option(min=1, help="Catalogue size (default: the fit's).")
    ] = None,
    fit: Annotated[
        Path | None, typer.Option(help="Parameters JSON (default: the MovieLens fit).")
    ] = None,
    url: Annotated[str, typer.Option(help="--to http: service URL.")] = "http://127.0.0.1:8000",
    api_key: Annotated[
        str | None,
        typer.Option(help="--to http: key with the ingest scope.", envvar="DRIFTLINE_API_KEY"),
    ] = None,
    bootstrap: Annotated[
        str,
        typer.Option(help="--to kafka: HOST:PORT.", envvar="DRIFTLINE_KAFKA_BOOTSTRAP"),
    ] = "127.0.0.1:9092",
    topic: Annotated[
        str, typer.Option(help="--to kafka: topic.", envvar="DRIFTLINE_KAFKA_TOPIC")
    ] = "events",
    batch_size: Annotated[int, typer.Option(min=1, help="Most events per request.")] = 500,
    pace: Annotated[
        bool, typer.Option("--pace/--no-pace", help="Kafka, HTTP: send at the arrival times.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object last.")] = False,
) -> None:
    """Generate a rating stream fitted to MovieLens, with a planted drift and its truth."""
    from benchmarks.replay import SINKS, ReplayConfig, ReplayError
    from benchmarks.streams import GeneratorConfig, StreamGenerator, load_fit
    from benchmarks.streams.writer import send_stream, write_file, write_truth

    options: dict[str, Any] = {
        key: value
        for key, value in (("share", drift_share), ("ramp", drift_ramp), ("shift", drift_shift))
        if value is not None
    }
    try:
        config = GeneratorConfig(
            events=events,
            seed=seed,
            fit=load_fit(fit),
            trace=trace,
            rate=rate,
            speed=speed,
            poisson=not regular,
            drift=drift,
            drift_at=drift_at,
            drift_options=options,
            active_users=active_users,
            items=items,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(str(exc).strip("'\"")) from None
    generator = StreamGenerator(config)
    prefix = f"gen{seed}"
    if to == "file":
        if output is None:
            raise typer.BadParameter("--to file needs --output PATH (- for standard output)")
        summary = write_file(generator, output, _format(output, fmt), prefix)
    elif to in SINKS:
        try:
            # The replay's sinks read only the target's fields of its configuration.
            sink = SINKS[to](
                ReplayConfig(
                    to=to,
                    dataset=Path("generated"),
                    trace=trace,
                    url=url,
                    api_key=api_key,
                    bootstrap=bootstrap,
                    topic=topic,
                    batch_size=batch_size,
                )
            )
            summary = send_stream(generator, sink, prefix, batch_size, pace)
        except ReplayError as exc:
            typer.echo(f"driftline generate: {exc}", err=True)
            raise typer.Exit(code=1) from None
    else:
        raise typer.BadParameter(f"unknown target {to!r}; choose file, kafka or http")
    where = _truth_path(output, truth)
    if where is not None:
        write_truth(generator, where, {"to": to, "output": None if output is None else str(output)})
    report = typer.echo if str(output) != "-" else (lambda line: typer.echo(line, err=True))
    for line in summary.lines():
        report(line)
    facts = generator.truth.to_dict()
    if facts["drift"] is not None:
        report(f"planted: {facts['description']}; {facts['drifted_events']:,} events changed")
    if where is not None:
        report(f"ground truth: {where}")
    if as_json:
        report(json.dumps({**summary.as_dict(), "truth": None if where is None else str(where)}))
