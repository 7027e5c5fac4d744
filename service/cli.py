"""The ``driftline`` command: the server's ``serve``, ``consume``, ``keys`` and ``settings``.

Every setting is a flag. The flags are generated from ``Settings``' fields (name in
kebab case, the field's description as help), so a new setting is on the command line
the moment it exists; a flag wins over its ``DRIFTLINE_*`` variable, which wins over the
default. ``none`` clears a setting that may be empty (``--refresh-events none``).

The tooling commands (the demo, benchmarks, replays, the embedded broker, the Lambda
package) belong to :mod:`benchmarks.cli` and join this group by name: it imports them
only when one of them runs or ``--help`` lists them, so the server never imports its
tooling.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import ipaddress
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from service.keys_cli import app as keys_app
from service.settings import Settings

#: The commands :mod:`benchmarks.cli` adds, in the order ``--help`` lists them.
TOOLING_COMMANDS = (
    "demo",
    "bench",
    "replay",
    "broker",
    "generate",
    "datasets",
    "package-function",
    "deploy-function",
)


@functools.cache
def _tooling() -> Any:
    """The tooling commands' group, imported on first use; None where ``benchmarks`` is
    not installed. (Typed loosely: typer vendors click, so its group's class depends on
    typer's version.)"""
    try:
        tooling = importlib.import_module("benchmarks.cli").tooling
    except ImportError:
        return None
    return typer.main.get_command(tooling)


class DriftlineGroup(TyperGroup):
    """``driftline``'s commands: the server's own, then the tooling commands, which are
    looked up in :mod:`benchmarks.cli` only when asked for by name or listed."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *TOOLING_COMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in TOOLING_COMMANDS:
            return command
        tooling = _tooling()
        return None if tooling is None else tooling.get_command(ctx, cmd_name)


app = typer.Typer(
    cls=DriftlineGroup, help="Driftline: streaming continual learning for recommendations."
)


#: Short names kept from earlier releases.
_ALIASES: dict[str, tuple[str, ...]] = {}


def _settings(**flags: Any) -> Settings:
    """Settings from the flags given (None: not given), the environment and defaults."""
    values = {
        name: (None if value == "none" else value)
        for name, value in flags.items()
        if value is not None
    }
    try:
        return Settings(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}"
            if error["loc"]
            else error["msg"]
            for error in exc.errors()
        )
        raise typer.BadParameter(problems) from None


def _metavar(annotation: Any) -> str:
    """What a flag takes, read from the field's type: ``INTEGER``, ``a|b|c``, ``FLOAT|none``.

    Values travel as text and pydantic parses them, so the metavar is the only place the
    help can say what a flag expects.
    """
    args = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) is Literal:
        return "|".join(str(arg) for arg in args)
    if args and len(args) < len(get_args(annotation)):  # Optional[X]
        return f"{_metavar(args[0])}|none"
    names = {int: "INTEGER", float: "FLOAT", Path: "PATH"}
    return names.get(annotation, "TEXT")


def _option(name: str) -> inspect.Parameter:
    """A ``--kebab-case`` flag for the settings field ``name``, defaulting to unset.

    The help says which variable the flag overrides and the default under both, so
    ``--help`` documents every setting in one place.
    """
    field = Settings.model_fields[name]
    default = "none" if field.default is None else field.default
    help_text = (
        f"{field.description or ''} (env DRIFTLINE_{name.upper()}, default {default})"
    ).lstrip()
    flag = "--" + name.replace("_", "-")
    if field.annotation is bool:
        flag = f"{flag}/--no-{name.replace('_', '-')}"
        annotation: Any = Annotated[bool | None, typer.Option(flag, help=help_text)]
    else:
        metavar = _metavar(field.annotation)
        option = typer.Option(flag, *_ALIASES.get(name, ()), help=help_text, metavar=metavar)
        annotation = Annotated[str | None, option]
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
    )


def with_settings_flags(command: Callable[[Settings], None]) -> Callable[..., None]:
    """``command(settings)`` as a typer command taking every setting as a flag."""

    def run(**flags: Any) -> None:
        command(_settings(**flags))

    run.__name__ = command.__name__
    run.__doc__ = command.__doc__
    options = [_option(name) for name in Settings.model_fields]
    run.__signature__ = inspect.Signature(options)  # type: ignore[attr-defined]
    return run


def show_settings(*, as_json: bool = False, markdown: bool = False, **flags: Any) -> None:
    """Print every setting in force, by concern, and where it came from; secrets masked.

    Each value came from a flag, an environment variable (named) or the default.
    """
    from service.settings import docs

    if markdown:
        typer.echo(docs.markdown(), nl=False)
        return
    entries = docs.effective(_settings(**flags), {n for n, v in flags.items() if v is not None})
    if as_json:
        typer.echo(json.dumps(docs.as_json(entries), indent=2))
    else:
        typer.echo(docs.as_text(entries), nl=False)


def _settings_command() -> Callable[..., None]:
    """``show_settings`` as a typer command: ``--json``, ``--markdown`` and every setting."""

    def run(**flags: Any) -> None:
        show_settings(**flags)

    run.__name__ = "settings"
    run.__doc__ = show_settings.__doc__
    json_flag = typer.Option("--json", help="Print one JSON object: {group: {setting: ...}}.")
    markdown_flag = typer.Option(
        "--markdown", help="Print the settings reference (docs/settings.md) instead."
    )
    switches = [
        inspect.Parameter(
            "as_json",
            inspect.Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[bool, json_flag],
        ),
        inspect.Parameter(
            "markdown",
            inspect.Parameter.KEYWORD_ONLY,
            default=False,
            annotation=Annotated[bool, markdown_flag],
        ),
    ]
    options = [_option(name) for name in Settings.model_fields]
    run.__signature__ = inspect.Signature(switches + options)  # type: ignore[attr-defined]
    return run


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("kafka").setLevel(logging.ERROR)  # our consumer logs what matters


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the service to this machine.

    Examples
    --------
    >>> [is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "10.0.0.5")]
    [True, True, True, False, False]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _check_exposure(settings: Settings) -> None:
    """Refuse to serve beyond loopback with no API key, unless told ``--insecure``.

    Without a key every route is open; on loopback only this machine's users can reach
    it, on any other address anyone on the network could ingest, read and start paid
    retraining jobs.
    """
    if is_loopback(settings.host):
        return
    from service.store import Database
    from service.store.keys import any_key_exists

    db = Database(settings.resolved_database_url)
    try:
        with db.connect() as conn:
            keyed = any_key_exists(conn)
    finally:
        db.dispose()
    if keyed:
        if set(settings.trusted_hosts) <= {"127.0.0.1", "localhost", "::1"}:
            logging.getLogger(__name__).warning(
                "serving on %s but TRUSTED_HOSTS holds only loopback names: clients that "
                "reach this service by another name are answered 400",
                settings.host,
            )
        return
    if settings.insecure:
        logging.getLogger(__name__).warning(
            "serving on %s with no API key (--insecure): anyone who can reach it can "
            "ingest, read and start retraining jobs",
            settings.host,
        )
        return
    typer.echo(
        f"refusing to serve on {settings.host} without API keys: anyone who can reach "
        "that address could ingest events, read recommendations and start paid "
        "retraining jobs. Create a key first (driftline keys create admin --scope admin), "
        "bind to 127.0.0.1, or pass --insecure to serve openly anyway.",
        err=True,
    )
    raise typer.Exit(2)


def serve(settings: Settings) -> None:
    """Run the service (embedded default: SQLite and file:// under --data-dir)."""
    import uvicorn
    from threadpoolctl import threadpool_limits

    from service.app import create_app
    from service.cluster.stream_process import StreamProcess

    _configure_logging(settings)
    _check_exposure(settings)
    # One BLAS thread: the server's concurrency is its requests, not one request's
    # arithmetic. A threaded matrix-vector product waits for a second core that a busy
    # machine does not have (0.18 ms single-threaded against 16 ms threaded for 10,000
    # items x 64 factors, measured here; BENCHMARKS.md).
    threadpool_limits(1, user_api="blas")
    sys.setswitchinterval(settings.server_switch_interval_ms / 1000)
    stream = StreamProcess.start(settings) if settings.stream_process else None
    try:
        uvicorn.run(
            create_app(settings, freeze_startup=True),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            access_log=False,
            loop=settings.server_loop,
            http=settings.server_http,
        )
    finally:
        if stream is not None:
            stream.stop()


def stream(settings: Settings) -> None:
    """Run the stream role without serving HTTP: consume Kafka when configured, learn
    the event log, and lead the cluster when elected (drift monitor, trigger, jobs).
    ``serve`` starts one beside itself with --stream-process."""
    _run_stream_role(settings, require_kafka=False)


def consume(settings: Settings) -> None:
    """Consume Kafka into the event store (and the stream components) without serving HTTP."""
    _run_stream_role(settings, require_kafka=True)


def _run_stream_role(settings: Settings, *, require_kafka: bool) -> None:
    import signal
    import threading

    from service.app import consumer_for
    from service.wiring import build_driftline

    if require_kafka and not settings.kafka_bootstrap:
        raise typer.BadParameter("--kafka-bootstrap (or DRIFTLINE_KAFKA_BOOTSTRAP) is required")
    _configure_logging(settings)
    driftline = build_driftline(settings, role="stream")
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        # Consumer lag and ingestion counters for Prometheus; read-only, no key needed.
        start_http_server(settings.metrics_port, settings.host, registry=driftline.metrics.registry)
    driftline.start()
    stopped = threading.Event()
    consumer = consumer_for(driftline) if settings.kafka_bootstrap else None

    def stop(*_: object) -> None:
        stopped.set()
        if consumer is not None:
            consumer.stop()

    signal.signal(signal.SIGTERM, stop)
    try:
        if consumer is not None:
            consumer.run()
        else:
            while not stopped.wait(1.0):
                pass
    except KeyboardInterrupt:
        stop()
    finally:
        driftline.shut_down()


app.command("serve")(with_settings_flags(serve))
app.command("consume")(with_settings_flags(consume))
app.command("stream")(with_settings_flags(stream))
app.add_typer(keys_app, name="keys")
app.command("settings")(_settings_command())


if __name__ == "__main__":
    app()
