"""The ``gpulens`` command line: the composition root that wires producers, pipeline and sinks."""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path

import click

from gpulens.cli_context import Context, pass_context
from gpulens.infra.launching import Status
from gpulens.main_job import EXAMPLES
from gpulens.platform import ORDER, manager, service_specs, start_platform, write_private_config
from gpulens.schemas.kafka.topic_admin import BrokerUnreachable
from gpulens.schemas.model.exceptions import GPULensError

log = logging.getLogger("gpulens")

COMMANDS = {
    "replay": "replay",
    "agent": "agent",
    "gateway": "gateway",
    "worker": "worker",
    "tables": "tables",
    "watch": "watch",
    "sink": "sink",
    "db": "sink",
    "exporter": "exporter",
    "retention": "retention",
    "simulate": "simulate",
    "api": "api",
    "report": "report",
    "reclaim": "reclaim",
}
"""The commands of the pipeline's processes -> their module in gpulens.commands, imported when
the command runs (or --help lists them): `gpulens retention` loaded every command's libraries,
numpy, the ClickHouse driver and the Kubernetes client among them, and each long-running
process kept them (16-45 MB of RSS in each, measured at rest)."""


class LazyGroup(click.Group):
    """A group whose :data:`COMMANDS` are imported on first use (click's documented pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = COMMANDS.get(cmd_name)
        if module is None:
            return super().get_command(ctx, cmd_name)
        command = getattr(importlib.import_module(f"gpulens.commands.{module}"), cmd_name)
        assert isinstance(command, click.Command)
        return command


@click.group(
    cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="GPULENS_CONFIG",
    help="TOML settings file (env GPULENS_CONFIG). GPULENS_* variables override it.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG level.")
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None, verbose: bool) -> None:
    """GPULens: an event-sourced observability pipeline for GPU clusters on Kubernetes.

    \b
    Start here:
      gpulens up        bring up the embedded platform and run the main job
      gpulens down      stop everything `up` started
      gpulens status    what runs, where
    Settings come from --config FILE and GPULENS_* variables, e.g.
    GPULENS_KAFKA__BOOTSTRAP_SERVERS=broker:9092 (see README, Configuration).
    """
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for chatty in ("httpx", "httpx2", "aiohttp.access"):  # one line per HTTP request is noise here
        logging.getLogger(chatty).setLevel(logging.WARNING)
    ctx.obj = Context(config_file)


# --- the platform ------------------------------------------------------------------------------


def _platform_up(context: Context) -> None:
    settings = context.settings
    specs = service_specs(settings, context.config_file)

    def report(name: str, status: Status | None, started: bool) -> None:
        if status is None:
            click.echo(f"  {name:<11} external")
            return
        verb = "started" if started else "already running"
        click.echo(f"  {name:<11} {verb:<16} {specs[name].host}:{specs[name].port}  pid {status.pid}")

    start_platform(manager(settings), specs, timeout=settings.platform.start_timeout_s, report=report)


def _platform_down(context: Context) -> None:
    services = manager(context.settings)
    for name in reversed(ORDER):
        stopped = services.stop(name)
        click.echo(f"  {name:<11} {'stopped' if stopped else 'was not running'}")


@cli.group()
def infra() -> None:
    """Start, stop and inspect the embedded platform (broker, registry, ClickHouse)."""


@infra.command("up")
@pass_context
def infra_up(context: Context) -> None:
    """Start the broker, the schema registry and the ClickHouse holder (idempotent)."""
    _platform_up(context)


@infra.command("down")
@pass_context
def infra_down(context: Context) -> None:
    """Stop exactly the services `infra up` started (by pid); data stays on disk."""
    _platform_down(context)


@infra.command("status")
@pass_context
def infra_status(context: Context) -> None:
    """Show each service: running, stopped, or stale (its process died)."""
    services = manager(context.settings)
    for name in ORDER:
        status = services.status(name)
        where = f"port {status.port}  pid {status.pid}  log {status.log}" if status.pid else ""
        click.echo(f"  {name:<11} {status.state.value:<8} {where}")


# --- topics and schemas ------------------------------------------------------------------------


@cli.group()
def topics() -> None:
    """The topic catalog: create the topics, list them."""


@topics.command("create")
@pass_context
def topics_create(context: Context) -> None:
    """Create every catalog topic that does not exist yet (idempotent)."""
    from gpulens.schemas.kafka.topic_admin import create_topics

    created = create_topics(context.settings.kafka)
    click.echo(f"created {len(created)} topics" + (": " + ", ".join(created) if created else ""))


@topics.command("list")
@pass_context
def topics_list(context: Context) -> None:
    """List the catalog: topic, record type, key, partitions on the broker, policy."""
    from gpulens.schemas.kafka.topic_admin import describe_topics

    for state in describe_topics(context.settings.kafka):
        spec = state.spec
        partitions = str(state.partitions) if state.exists else "missing"
        kept = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms // 86_400_000} d"
        click.echo(
            f"{spec.name:<30} {spec.record.__name__:<16} key cluster/{spec.key_field:<9} "
            f"partitions {partitions:<8} {spec.cleanup_policy}, {kept}"
        )


@cli.group()
def schemas() -> None:
    """The Avro schemas of the event model."""


@schemas.command("export")
@click.option("--check", is_flag=True, help="Only check that the committed .avsc files match the models.")
def schemas_export(check: bool) -> None:
    """Write gpulens/schemas/model/avro/*.avsc from the pydantic models (or --check they match)."""
    from gpulens.schemas.model.avro_schema import derive, render, schema_path
    from gpulens.schemas.model.topics import CATALOG

    stale = []
    for spec in CATALOG:
        path, text = schema_path(spec.record), render(derive(spec.record))
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.name)
        if not check:
            path.write_text(text)
    if check and stale:
        raise click.ClickException(f"out of date: {', '.join(stale)}; run `gpulens schemas export`")
    click.echo(f"{'stale' if check else 'written'}: {', '.join(stale) or 'none'}")


@schemas.command("register")
@pass_context
def schemas_register(context: Context) -> None:
    """Register every topic's schema with the registry (BACKWARD-compatible changes only)."""
    from gpulens.schemas.model.topics import CATALOG
    from gpulens.schemas.wire.codec import AvroCodec, registry_client

    codec = AvroCodec(registry_client(context.settings.registry.url))
    for spec in CATALOG:
        click.echo(f"{spec.subject:<36} id {codec.schema_id(spec)}")


# --- components in the foreground ----------------------------------------------------------------


@cli.group()
def serve() -> None:
    """Run one platform component in the foreground (what `infra up` starts in the background)."""


@serve.command("registry")
@pass_context
def serve_registry(context: Context) -> None:
    """The embedded schema registry on registry.url, stored in the registry.store_topic topic."""
    from urllib.parse import urlparse

    from gpulens.infra.registry import SchemaStore, serve

    settings = context.settings
    url = urlparse(settings.registry.url)
    store = SchemaStore(
        settings.kafka,
        topic=settings.registry.store_topic,
        default_compatibility=settings.registry.compatibility,
    )
    log.info("schema registry on %s (store: topic %s)", settings.registry.url, settings.registry.store_topic)
    serve(store, host=url.hostname or "127.0.0.1", port=url.port or 80)


@serve.command("clickhouse")
@pass_context
def serve_clickhouse(context: Context) -> None:
    """Hold the embedded ClickHouse engine and serve the ClickHouse HTTP interface."""
    from gpulens.infra.clickhouse.engine import LIBRARY, EmbeddedEngine
    from gpulens.infra.clickhouse.http_endpoint import serve
    from gpulens.tuning import hand_back_library_pages

    settings = context.settings
    engine = EmbeddedEngine(settings.chdb_path)
    if LIBRARY is not None:
        hand_back_library_pages(LIBRARY)
    log.info(
        "ClickHouse (chDB) at %s on http://%s:%d",
        settings.chdb_path,
        settings.clickhouse.http_host,
        settings.clickhouse.http_port,
    )
    serve(
        engine,
        host=settings.clickhouse.http_host,
        port=settings.clickhouse.http_port,
        max_sessions=settings.clickhouse.http_max_sessions,
    )


# --- the main job --------------------------------------------------------------------------------


@cli.command("smoke")
@pass_context
def smoke(context: Context) -> None:
    """Publish one record of every type and read each back (checks broker, registry, codec).

    The records belong to the cluster gpulens-smoke, whatever the configured cluster: stamped
    now, they would otherwise move that cluster's event time past any replay of a past trace.
    """
    from gpulens.smoke import run_smoke

    for r in run_smoke(context.settings):
        click.echo(
            f"  {r.record_type:<16} {r.topic:<30} schema id {r.schema_id:<3} "
            f"partition {r.partition} offset {r.offset:<6} {r.round_trip_ms:6.1f} ms"
        )


@cli.command("up")
@click.option(
    "--replay/--no-replay",
    "with_replay",
    default=None,
    help=(
        "Replay the public traces in the repository's traces/ "
        "[default: when no Kubernetes cluster is reachable]."
    ),
)
@click.option("--foreground", is_flag=True, help="Stay attached after the report; Ctrl-C stops everything.")
@click.option(
    "--private",
    "private_dir",
    metavar="DIR",
    type=click.Path(path_type=Path, file_okay=False),
    help="A private platform beside any other: free ports, state and DIR/gpulens.toml under DIR "
    "(written on the first run, reused after); other commands take it with --config.",
)
@pass_context
def up(context: Context, with_replay: bool | None, foreground: bool, private_dir: Path | None) -> None:
    """Bring up everything on this machine and show what the pipeline makes of real data.

    \b
    1. the embedded platform: Kafka broker, schema registry, ClickHouse engine + HTTP SQL
    2. topics, a smoke check of every record type, the ClickHouse tables
    3. the pipeline: worker, sink, exporter and the API, kept running by a supervisor (a
       process that exits is restarted and the restart shown by `gpulens status`)
    4. data: the Kubernetes watchers when a kubeconfig or in-cluster account is there,
       otherwise the Alibaba GPU-cluster trace and the GenAI duty cycles, replayed
    5. a report computed from ClickHouse and the state topics, and where everything is
    Idempotent: what runs already is left alone. Processes stay up (detached) until
    `gpulens down`, unless --foreground.
    """
    from gpulens.consumers.clickhouse.migrating import migrate
    from gpulens.main_job import (
        kubernetes_reachable,
        print_report,
        replay_traces,
        start_pipeline,
        wait_until_drained,
    )
    from gpulens.schemas.kafka.topic_admin import create_topics
    from gpulens.smoke import run_smoke

    if private_dir is not None:
        context = click.get_current_context().obj = _private_context(context, private_dir)
        click.echo(f"private platform: config {context.config_file}")
    gpulens = f"gpulens --config {context.config_file}" if private_dir is not None else "gpulens"
    settings = context.settings
    click.echo("platform:")
    _platform_up(context)
    created = create_topics(settings.kafka)
    click.echo(f"topics: {len(created)} created, catalog complete")
    checked = run_smoke(settings)
    click.echo(f"smoke: {len(checked)} record types through broker and registry and back")
    applied = migrate(settings.clickhouse, samples_ttl_days=settings.sink.samples_ttl_days)
    click.echo(f"ClickHouse: database {settings.clickhouse.database}, {len(applied)} migrations applied")
    watch = kubernetes_reachable()
    click.echo("pipeline:")
    start_pipeline(settings, manager(settings), context.config_file, click.echo, watch=watch)
    if watch:
        click.echo("data: watching the Kubernetes cluster of the kubeconfig (gpulens watch)")
    if with_replay or (with_replay is None and not watch):
        click.echo(
            "data: replaying the public traces (no Kubernetes cluster is watched; see `gpulens watch`)"
        )
        published = replay_traces(settings)
        click.echo(f"  {published:,} events published; waiting for the pipeline to process them ...")
        wait_until_drained(settings, click.echo)
        print_report(settings, click.echo)
    click.echo(
        "\nready:\n"
        f"  Kafka            {settings.kafka.bootstrap_servers}\n"
        f"  schema registry  {settings.registry.url}\n"
        f"  ClickHouse SQL   {settings.clickhouse.url}  (database {settings.clickhouse.database})\n"
        f"  metrics          http://{settings.exporter.host}:{settings.exporter.port}/metrics\n"
        f"  API              http://{settings.api.host}:{settings.api.port}/api/clusters"
        f"  (OpenAPI: /openapi.json{'; token required' if settings.api.token else ''})\n"
        f"  logs             {settings.platform.state_dir / 'logs'}\n"
        "try:\n" + "\n".join(f'  {gpulens} sql "{q}"' for q in EXAMPLES) + f"\nstop with: {gpulens} down"
        f"\nconsole: http://{settings.api.host}:{settings.api.port}/  (the web console; open it in a browser)"
    )
    if foreground:
        click.echo("attached: Ctrl-C stops everything")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
        click.get_current_context().invoke(down)


def _private_context(context: Context, directory: Path) -> Context:
    """The context of a private platform under ``directory``; its config file is written once
    (ports free at that moment) and reused, so `up --private DIR` again finds what runs."""
    if context.config_file is not None:
        raise click.UsageError("--private writes its own config file: leave out --config")
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "gpulens.toml"
    return Context(config if config.is_file() else write_private_config(directory))


@cli.command("down")
@pass_context
def down(context: Context) -> None:
    """Stop everything `gpulens up` started: the pipeline first (it flushes), then the platform."""
    from gpulens.main_job import stop_pipeline

    stop_pipeline(manager(context.settings), click.echo)
    _platform_down(context)


NOT_DRAINED, LAG_UNKNOWN = 3, 4
"""Exit codes of `gpulens status` (0: drained), for scripts that wait for the pipeline."""


@cli.command("status")
@pass_context
def status(context: Context) -> None:
    """What runs, where: the platform, the pipeline's processes, their restarts, and each
    consumer group's lag in records (transaction markers excluded).

    \b
    Exit status: 0 when every consumer group of the pipeline has drained (consumed every
    record), 3 when one has not (or has not started), 4 when the broker did not answer.
    """
    from gpulens.draining import measure
    from gpulens.infra.launching import State
    from gpulens.infra.supervising import read_restarts
    from gpulens.main_job import PIPELINE, SUPERVISOR
    from gpulens.schemas.kafka.lag import LagError, RecordLag

    services = manager(context.settings)
    click.get_current_context().invoke(infra_status)
    for name in (SUPERVISOR, *PIPELINE):
        current = services.status(name)
        if current.state is State.STOPPED and name != SUPERVISOR:
            continue
        where = f"pid {current.pid}  log {current.log}" if current.pid else ""
        click.echo(f"  {name:<11} {current.state.value:<8} {where}")
    for restart in read_restarts(services):
        when = datetime.fromtimestamp(restart.at).isoformat(timespec="seconds")
        click.echo(f"  restarted {restart.name} at {when} ({restart.exit_status}; restart {restart.count})")
    click.echo("consumer groups (lag in records):")
    lag = RecordLag(context.settings.kafka, timeout_s=5)
    try:
        groups = measure(context.settings, lag)
    except LagError as err:
        click.echo(f"  lag unknown: {err}")
        sys.exit(LAG_UNKNOWN)
    finally:
        lag.close()
    for group in groups:
        behind = ", ".join(f"{t} {n:,}" for t, n in sorted(group.topics.items()) if n)
        state = "drained" if group.drained else f"behind: {behind}" if behind else "not started"
        click.echo(f"  {group.group:<26} {group.records:>10,}  {state}")
    drained = all(g.drained for g in groups)
    click.echo(f"pipeline: {'drained' if drained else 'not drained'}")
    if not drained:
        sys.exit(NOT_DRAINED)


@cli.command("supervise")
@click.option("--watch", is_flag=True, help="Also run `gpulens watch` (a Kubernetes cluster is reachable).")
@pass_context
def supervise(context: Context, watch: bool) -> None:
    """Run the pipeline's processes (worker, sink, exporter, API, ...) and restart any that exits.

    `gpulens up` starts this in the background; `gpulens down` stops it, and it stops the
    processes it runs (each writes what it buffers first). Restarts are logged and shown
    by `gpulens status`.
    """
    from gpulens.infra.supervising import Supervisor
    from gpulens.main_job import pipeline_specs

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _s, _f: stop.set())
    specs = pipeline_specs(context.settings, context.config_file, watch=watch)
    log.info("supervising %s", ", ".join(specs))
    Supervisor(manager(context.settings), list(specs.values())).run(stop)


@cli.command("sql")
@click.argument("query")
@click.option("--format", "fmt", default="PrettyCompact", show_default=True, help="ClickHouse output format.")
@pass_context
def sql(context: Context, query: str, fmt: str) -> None:
    """Run QUERY against the configured ClickHouse and print the result."""
    from gpulens.consumers.clickhouse.client import get_client

    client = get_client(context.settings.clickhouse)
    click.echo(client.raw_query(query, fmt=fmt).decode(), nl=False)


EX_UNAVAILABLE = 69
"""Exit status (sysexits.h) of a command that found no broker: a supervisor or a script can
tell a broker that is away (try again later) from a failure of the command itself (1)."""


def main() -> None:
    """Entry point: one-line errors for what the user can fix, tracebacks only with -v."""
    try:
        cli(standalone_mode=True)
    except BrokerUnreachable as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(EX_UNAVAILABLE)
    except GPULensError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
