"""``driftline``'s tooling commands: the demo, benchmarks, replays, the embedded broker
and the Lambda package.

They join the ``driftline`` command of :mod:`service.cli` by name (its
``TOOLING_COMMANDS``), which imports this module only when one of them is asked for, so
the server never imports its tooling. ``app`` is that whole command.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.datasets.cli import datasets
from benchmarks.streams.cli import generate
from service.cli import app

__all__ = ["app", "tooling"]

#: The tooling commands; ``driftline`` finds them here by name.
tooling = typer.Typer(help="Driftline's tooling: demo, benchmarks, replays, broker, packaging.")
tooling.command()(generate)
tooling.add_typer(datasets, name="datasets")


@tooling.command()
def broker(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1.")] = 9092,
    topic: Annotated[str, typer.Option(help="Topic to create.")] = "events",
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the topic.")] = 4,
) -> None:
    """Run the embedded Kafka-protocol broker (Tansu, in-memory log) until stopped."""
    import signal
    import time

    from benchmarks.broker import EmbeddedBroker

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(message)s")
    with EmbeddedBroker(port=port, topic=topic, partitions=partitions) as running:
        typer.echo(f"broker on {running.bootstrap}, topic {topic!r} with {partitions} partitions")
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        try:
            while not stop["now"] and running.process and running.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


@tooling.command()
def demo(
    limit: Annotated[
        int | None, typer.Option(help="Replay only the first N ratings (shorter demo).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, help="Most events per POST /ingest or per replay step.")
    ] = 500,
    user: Annotated[str | None, typer.Option(help="User whose top 10 to show.")] = None,
    kafka: Annotated[
        bool, typer.Option("--kafka", help="Replay through an embedded Kafka broker.")
    ] = False,
    drift: Annotated[
        bool,
        typer.Option(
            "--drift/--no-drift",
            help="Plant a taste inversion of 30 % of users at 60 % of the stream.",
        ),
    ] = True,
    rate: Annotated[
        float,
        typer.Option(
            min=1.0,
            help="Events per second the ratings are replayed at, steadily, whatever jobs "
            "are running (about 40 s for MovieLens at 2,500).",
        ),
    ] = 2_500.0,
    dataset: Annotated[
        Path | None,
        typer.Option(help="Ratings file or folder (default: MovieLens if found, else generated)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the figures as one JSON object last.")
    ] = False,
) -> None:
    """Replay MovieLens (or a stream generated like it) through a live service."""
    from benchmarks.demo import run_demo

    run_demo(
        limit=limit,
        batch_size=batch_size,
        user=user,
        kafka=kafka,
        drift=drift,
        rate=rate,
        dataset=dataset,
        as_json=as_json,
    )


@tooling.command()
def bench(
    name: Annotated[
        str,
        typer.Argument(
            help=(
                "Benchmark: prequential, stages, store, drift, ingest, sync, memory, serve, "
                "cluster, configurator, policies, generator, gpu, soak or archive."
            )
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object last.")] = False,
    dataset: Annotated[Path | None, typer.Option(help="Ratings file to replay.")] = None,
    limit: Annotated[int | None, typer.Option(help="Use the first N ratings.")] = None,
    batch_size: Annotated[int, typer.Option(help="Events per ingested batch.")] = 500,
    workers: Annotated[
        int | None, typer.Option(help="sync: λ of the local-runtime race (default 8).")
    ] = None,
    simulated_workers: Annotated[
        list[int] | None,
        typer.Option(help="sync: λ of each simulated race (default 64 and 256); repeatable."),
    ] = None,
    seconds: Annotated[
        float | None,
        typer.Option(
            help="serve, cluster: seconds of load per measurement (default 15; cluster 8)."
        ),
    ] = None,
    catalogue_items: Annotated[
        int | None,
        typer.Option(help="serve: items of the synthetic catalogue (default 1,000,000)."),
    ] = None,
    seeds: Annotated[
        int | None,
        typer.Option(help="configurator: seeds per scenario (default 30); policies: 3."),
    ] = None,
    minutes: Annotated[
        float | None,
        typer.Option(help="policies: virtual minutes of each trace (default 120)."),
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(help="policies: write the plots and a markdown report into this folder."),
    ] = None,
    compute_scale: Annotated[
        float | None,
        typer.Option(
            help="policies: compute per sample as a multiple of the calibrated worker's (32)."
        ),
    ] = None,
    stream: Annotated[
        str | None,
        typer.Option(
            help=(
                "policies: movielens (spread over each trace, default) or generated "
                "(each trace's true arrivals, one event each; --limit caps them)."
            )
        ),
    ] = None,
    epochs: Annotated[
        int | None, typer.Option(help="configurator: epochs per job (default 50).")
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="configurator: write the regret plot (PNG) here; soak: the folder for its plots."
        ),
    ] = None,
    events: Annotated[
        int | None,
        typer.Option(
            min=1_000, help="soak: events of the stream (default 10^7); archive: of the log (10^6)."
        ),
    ] = None,
    replicas: Annotated[
        int | None, typer.Option(min=1, help="soak: driftline serve replicas (default 2).")
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(help="soak: most events per second produced (default: as fast as stored)."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="configurator: a first look in minutes (1 seed, 15 epochs, four methods, "
            "progress measured on a small window), with a progress bar.",
        ),
    ] = False,
    windows: Annotated[
        list[int] | None,
        typer.Option(
            help="gpu: window sizes in ratings (default 200,000 and 2,000,000); repeatable."
        ),
    ] = None,
) -> None:
    """Run a benchmark and print its measured figures."""
    import inspect

    from benchmarks.bench import BENCHMARKS

    if name not in BENCHMARKS:
        raise typer.BadParameter(f"unknown benchmark {name!r}; choose from {sorted(BENCHMARKS)}")
    run = BENCHMARKS[name]
    options = {
        "workers": workers,
        "simulated_workers": simulated_workers,
        "seconds": seconds,
        "catalogue_items": catalogue_items,
        "seeds": seeds,
        "epochs": epochs,
        "plot": plot,
        "minutes": minutes,
        "report": report,
        "compute_scale": compute_scale,
        "stream": stream,
        "events": events,
        "replicas": replicas,
        "rate": rate,
        "quick": quick or None,
        "windows": windows,
    }
    given = {key: value for key, value in options.items() if value is not None}
    accepted = inspect.signature(run).parameters
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise typer.BadParameter(f"bench {name} takes no {', '.join(unknown)}")
    result = run(dataset=dataset, limit=limit, batch_size=batch_size, **given)
    if as_json:
        typer.echo(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            typer.echo(f"{key:32} {value}")


@tooling.command()
def replay(
    to: Annotated[str, typer.Option(help="Target: http (POST /ingest) or kafka.")],
    dataset: Annotated[Path, typer.Option(help="Ratings file (MovieLens CSV or TSV).")],
    trace: Annotated[
        str, typer.Option(help="Arrival trace: constant, wiki, berkeley, twitter, wits.")
    ],
    speed: Annotated[float, typer.Option(help="Play the trace X times faster.")] = 1.0,
    url: Annotated[str, typer.Option(help="Service URL (--to http).")] = "http://127.0.0.1:8000",
    bootstrap: Annotated[
        str, typer.Option(help="Kafka HOST:PORT (--to kafka).", envvar="DRIFTLINE_KAFKA_BOOTSTRAP")
    ] = "127.0.0.1:9092",
    topic: Annotated[
        str, typer.Option(help="Kafka topic (--to kafka).", envvar="DRIFTLINE_KAFKA_TOPIC")
    ] = "events",
    limit: Annotated[int | None, typer.Option(help="Replay only the first N ratings.")] = None,
    batch_size: Annotated[int, typer.Option(help="Most events per request or flush.")] = 500,
    rate: Annotated[
        float | None, typer.Option(help="Events per second of the constant trace (1000).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object last.")] = False,
    api_key: Annotated[
        str | None,
        typer.Option(help="Key with the ingest scope (--to http).", envvar="DRIFTLINE_API_KEY"),
    ] = None,
) -> None:
    """Replay a ratings file to HTTP or Kafka at the pace of an arrival-rate trace."""
    from benchmarks.replay import ReplayConfig, ReplayError, run_replay

    try:
        config = ReplayConfig(
            to=to,
            dataset=dataset,
            trace=trace,
            speed=speed,
            url=url,
            api_key=api_key,
            bootstrap=bootstrap,
            topic=topic,
            limit=limit,
            batch_size=batch_size,
            rate=rate,
        )
        summary = run_replay(config)
    except ReplayError as exc:
        typer.echo(f"driftline replay: {exc}", err=True)
        raise typer.Exit(code=1) from None
    except KeyboardInterrupt:
        typer.echo("driftline replay: interrupted", err=True)
        raise typer.Exit(code=130) from None
    for line in summary.lines():
        typer.echo(line)
    if as_json:
        typer.echo(json.dumps(summary.as_dict(), sort_keys=True))


@tooling.command("package-function")
def package_function(
    output: Annotated[Path, typer.Option(help="Zip file to write.")] = Path(
        "dist/driftline-worker.zip"
    ),
) -> None:
    """Build the AWS Lambda zip of the retraining worker (handler lambda_function.handler)."""
    from deploy.packaging import build_worker_zip

    info = build_worker_zip(output)
    typer.echo(f"wrote {info.path} ({info.size:,} bytes, {len(info.entries)} files)")
    typer.echo(f"handler {info.handler}; numpy is not included: add a numpy layer")
    typer.echo(f"sha256 {info.sha256}")


@tooling.command("deploy-function")
def deploy_function(
    name: Annotated[str, typer.Option(help="Lambda function name.")] = "driftline-worker",
    role: Annotated[
        str | None, typer.Option(help="Execution role ARN (needed to create the function).")
    ] = None,
    memory: Annotated[int, typer.Option(help="Memory in MB (1,769 MB = one vCPU).")] = 1769,
    timeout: Annotated[int, typer.Option(help="Time limit in seconds (at most 900).")] = 900,
    layer: Annotated[
        list[str] | None, typer.Option(help="Layer ARN, e.g. one that provides numpy.")
    ] = None,
) -> None:
    """Create or update the retraining worker on AWS Lambda (credentials from boto3)."""
    import boto3

    from deploy.packaging import DeploySpec, deploy_worker

    spec = DeploySpec(
        name=name, role_arn=role, memory_mb=memory, timeout_s=timeout, layers=tuple(layer or ())
    )
    configuration = deploy_worker(boto3.client("lambda"), spec)
    typer.echo(
        f"{configuration.get('FunctionName', name)}: {configuration.get('MemorySize')} MB, "
        f"{configuration.get('Timeout')} s, sha256 {configuration.get('CodeSha256', '?')}"
    )


if __name__ == "__main__":
    app()
