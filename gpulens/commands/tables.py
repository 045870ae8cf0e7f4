"""`gpulens tables`: the faust app owning the entity tables (gpulens.state.*.v1)."""

from __future__ import annotations

from pathlib import Path

import click

from gpulens.cli_context import Context, pass_context
from gpulens.commands.service import Service, run_service


@click.command()
@click.option(
    "--group",
    "group_id",
    default="gpulens-tables",
    show_default=True,
    help="faust app id: consumer group, transactional ids, internal topics.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="RocksDB stores (one per process) [default: <state dir>/tables/<group>].",
)
@click.option(
    "--web-port",
    type=click.IntRange(1, 65535),
    default=6066,
    show_default=True,
    help="Port of the HTTP views (on 127.0.0.1).",
)
@click.option(
    "--instance",
    default="tables-0",
    show_default=True,
    help="Static member id in the group: distinct per process, the same across its restarts.",
)
@click.option(
    "--standby-replicas",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Copies of every table that other processes of the group keep ready.",
)
@pass_context
def tables(
    context: Context,
    group_id: str,
    data_dir: Path | None,
    web_port: int,
    instance: str,
    standby_replicas: int,
) -> None:
    """Materialize pods, nodes, inventories, containers and workloads (faust-streaming).

    Each table's changelog is a public compacted topic, gpulens.state.*.v1 (Avro under
    <topic>-value, keys cluster/entity), and inventories also feed the device changelog
    gpulens.changelog.devices.v1. Exactly once (Kafka transactions, across kill -9 and
    rebalances: see README), stores in RocksDB rebuilt from
    the committed changelogs at every start, standby replicas when several processes run
    (each with its own --instance and --data-dir).
    HTTP on 127.0.0.1: /pods/CLUSTER/UID, /workloads/CLUSTER/UID (with its pods and child
    workloads), /nodes/CLUSTER/NODE (with its devices). Undecodable records go to the DLQ.
    Stops on SIGTERM/Ctrl-C.
    """
    from gpulens.pipeline.entity_tables import SOURCES, TablesOptions, forwarded_topic, run_tables
    from gpulens.schemas.model.topics import DEVICE_CHANGELOG, DLQ, STATE_TOPICS

    settings = context.settings
    options = TablesOptions(
        group_id=group_id,
        data_dir=data_dir or settings.platform.state_dir / "tables" / group_id,
        web_port=web_port,
        instance=instance,
        standby_replicas=standby_replicas,
    )

    def work(service: Service) -> None:
        options.data_dir.mkdir(parents=True, exist_ok=True)
        loglevel = {"WARNING": "warn"}.get(settings.log_level, settings.log_level.lower())
        run_tables(settings.kafka, service.codec, options, loglevel=loglevel)

    run_service(
        settings,
        work,
        topics=[*SOURCES, *STATE_TOPICS, DEVICE_CHANGELOG, DLQ, forwarded_topic(group_id)],
        signals=(),  # faust stops the app on SIGTERM/Ctrl-C itself
        banner=f"tables {group_id}: reading {settings.kafka.bootstrap_servers}, "
        f"views on http://{options.web_host}:{web_port}, stores in {options.data_dir}",
    )
