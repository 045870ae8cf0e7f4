"""`gpulens sink` and `gpulens db migrate`: the ClickHouse schema and the sink that fills it."""

from __future__ import annotations

import click

from gpulens.cli_context import Context, ShardType, pass_context, with_flags
from gpulens.commands.service import Metrics, run_service
from gpulens.schemas.kafka.sharding import Shard
from gpulens.schemas.model.topics import CATALOG


@click.command()
@click.option("--batch-rows", type=click.IntRange(min=1), help="Rows per insert batch [sink.batch_rows].")
@click.option(
    "--batch-seconds",
    type=click.FloatRange(min=0, min_open=True),
    help="Oldest age of a batch [sink.batch_seconds].",
)
@click.option(
    "--state-batch-seconds",
    type=click.FloatRange(min=0, min_open=True),
    help="Oldest age of a batch of everything but GPU samples [sink.state_batch_seconds].",
)
@click.option("--group", "group_id", help="Consumer group [sink.group_id]; one group per database.")
@click.option(
    "--shard",
    type=ShardType(),
    default="0/1",
    show_default=True,
    help="Run N sinks of one group as 0/N .. N-1/N: shard I reads partitions p with p % N == I.",
)
@click.option("--metrics-port", type=click.IntRange(1, 65535), help="Serve Prometheus /metrics on this port.")
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address /metrics binds (0.0.0.0 in a pod).",
)
@pass_context
def sink(
    context: Context, /, shard: Shard, metrics_port: int | None, metrics_host: str, **_sink_flags: object
) -> None:
    """Write every catalog topic into ClickHouse tables (clickhouse.database), until SIGTERM/Ctrl-C.

    Applies the migrations first (waiting for ClickHouse if it is away), then consumes, writes
    batches bounded by rows and age (GPU samples every --batch-seconds, the other tables every
    --state-batch-seconds), and commits Kafka offsets only after ClickHouse accepted a batch.
    On SIGTERM/Ctrl-C the batches in hand are written and committed before it exits. To spread
    the load, run N sinks of one group with --shard 0/N ... N-1/N (a killed one is restarted
    with its own shard: nothing is lost or stored twice).
    """
    from gpulens.consumers.clickhouse.sinking import run_sink

    settings = context.settings
    options = with_flags(settings.sink)
    registry_for_clickhouse = options.clickhouse_registry_url or settings.registry.url
    run_service(
        settings,
        lambda service: run_sink(
            settings.kafka,
            service.codec,
            settings.clickhouse,
            options,
            service.stop,
            shard=shard,
            registry_url=registry_for_clickhouse if options.decode_in_clickhouse else None,
        ),
        topics=CATALOG,
        metrics=Metrics(metrics_port, metrics_host),
        banner=f"sink: {settings.kafka.bootstrap_servers} -> {settings.clickhouse.url} "
        f"database {settings.clickhouse.database}, batches of {options.batch_rows} rows / "
        f"{options.batch_seconds} s (the other tables {options.state_batch_seconds} s), shard {shard}",
        tuned=True,
    )


@click.group()
def db() -> None:
    """The ClickHouse schema (clickhouse.database)."""


@db.command("migrate")
@pass_context
def db_migrate(context: Context) -> None:
    """Create the database and apply the migrations it lacks (idempotent); print what was applied."""
    from gpulens.consumers.clickhouse.migrating import migrate

    settings = context.settings
    done = migrate(settings.clickhouse, samples_ttl_days=settings.sink.samples_ttl_days)
    for line in done:
        click.echo(line)
    click.echo(f"{settings.clickhouse.database}: {'migrated' if done else 'up to date'}")
