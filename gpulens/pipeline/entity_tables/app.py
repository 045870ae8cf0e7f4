"""The faust app and its tables: which table's changelog is which public topic.

Every table is keyed by raw ``cluster/entity`` bytes and holds raw bytes (the app's key and
value serializers are ``raw``), so a public table's changelog records are exactly today's
state-topic records. A table write goes to the changelog partition of the event being
processed, inside the transaction that commits that event's offset (exactly once): so each
public table is fed only from a source topic with its partition count and key hashing —
pods from gpulens.pods.v1, nodes and inventories from their topics, containers from theirs
(a container's key lands in its node's partition, always the same one), workloads from
gpulens.workloads.v1 and the forwarded pods (see forwarding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import faust
from faust.types import TableT

from gpulens.pipeline.entity_tables.exactly_once import IncarnationApp
from gpulens.pipeline.entity_tables.incarnations import Ledger
from gpulens.pipeline.entity_tables.recovery import ChangelogTails, PromptTableManager
from gpulens.schemas.kafka.settings import KafkaSettings
from gpulens.schemas.model.topics import (
    CONTAINERS,
    DEVICE_CHANGELOG,
    DEVICE_INVENTORY,
    NODES,
    PODS,
    STATE_CONTAINERS,
    STATE_INVENTORY,
    STATE_NODES,
    STATE_PODS,
    STATE_WORKLOADS,
    WORKLOADS,
    TopicSpec,
)

SOURCES = (PODS, NODES, DEVICE_INVENTORY, CONTAINERS, WORKLOADS)
"""The topics the app reads (create them before it starts: faust expects their partitions)."""


@dataclass(frozen=True, slots=True)
class TablesOptions:
    """How one `gpulens tables` process runs."""

    group_id: str
    """Consumer group, faust app id, prefix of transactional ids and internal topics."""
    data_dir: Path
    """Where the RocksDB stores live (one per process: two processes need two)."""
    web_port: int
    web_host: str = "127.0.0.1"
    instance: str = "tables-0"
    """Static member id in the group, distinct per process and the same across its restarts:
    noida-db never expires a member killed with SIGKILL, so a restarted process gets its
    partitions back only by taking its former place (measured: without it, a restarted app
    re-joined every 6 s for minutes and never got a partition)."""
    standby_replicas: int = 1
    """Other processes of the group keep this many copies of every table, ready to take over."""

    @property
    def stores(self) -> Path:
        """The RocksDB stores: rebuilt from the committed changelogs at every start."""
        return self.data_dir / "stores"

    @property
    def ledger(self) -> Path:
        """The transactional ids of this process's incarnations (see incarnations)."""
        return self.data_dir / "transactions"


@dataclass(frozen=True, slots=True)
class Tables:
    """The app's tables, by what they hold."""

    pods: TableT[bytes, bytes]
    nodes: TableT[bytes, bytes]
    inventories: TableT[bytes, bytes]
    containers: TableT[bytes, bytes]
    workloads: TableT[bytes, bytes]
    device_changes: TableT[bytes, bytes]
    """The newest change per node; its changelog is the device changelog topic."""
    workload_records: TableT[bytes, bytes]
    """Internal: each workload's full state (JSON), changelog ``<group>-workload-records-changelog``."""
    forwarded: TableT[bytes, bytes]
    """Internal: per workload partition and pod partition, the last forwarded pod applied."""


def build_app(kafka: KafkaSettings, options: TablesOptions, ledger: Ledger) -> IncarnationApp:
    """The faust app: exactly once under this incarnation's transactional ids, RocksDB stores
    recovered from the changelogs, web views on ``options.web_host`` only."""
    return IncarnationApp(
        options.group_id,
        ledger=ledger,
        changelog_tails=ChangelogTails(kafka),
        TableManager=PromptTableManager,
        broker=[f"kafka://{server.strip()}" for server in kafka.bootstrap_servers.split(",")],
        store="rocksdb://",
        datadir=str(options.stores),
        processing_guarantee="exactly_once",
        key_serializer="raw",
        value_serializer="raw",
        broker_session_timeout=6,
        consumer_group_instance_id=f"{options.group_id}-{options.instance}",
        table_standby_replicas=options.standby_replicas,
        web_host=options.web_host,
        web_bind=options.web_host,
        web_port=options.web_port,
        consumer_auto_offset_reset="earliest",
        autodiscover=False,
    )


def source(app: faust.App, *specs: TopicSpec) -> faust.TopicT:
    """The raw records of ``specs`` (decoded by the agents, so a bad one can be dead-lettered)."""
    return app.topic(*(spec.name for spec in specs), key_type=bytes, value_type=bytes)


def _public(app: faust.App, name: str, spec: TopicSpec) -> TableT[bytes, bytes]:
    changelog = app.topic(spec.name, key_type=bytes, value_type=bytes, partitions=spec.partitions)
    return app.Table(
        name,
        key_type=bytes,
        value_type=bytes,
        partitions=spec.partitions,
        changelog_topic=changelog,
        help=spec.doc,
    )


def _internal(app: faust.App, name: str, partitions: int) -> TableT[bytes, bytes]:
    return app.Table(name, key_type=bytes, value_type=bytes, partitions=partitions)


def define_tables(app: faust.App) -> Tables:
    """Declare the tables on ``app``."""
    return Tables(
        pods=_public(app, "pods", STATE_PODS),
        nodes=_public(app, "nodes", STATE_NODES),
        inventories=_public(app, "inventories", STATE_INVENTORY),
        containers=_public(app, "containers", STATE_CONTAINERS),
        workloads=_public(app, "workloads", STATE_WORKLOADS),
        device_changes=_public(app, "device-changes", DEVICE_CHANGELOG),
        workload_records=_internal(app, "workload-records", STATE_WORKLOADS.partitions),
        forwarded=_internal(app, "forwarded", STATE_WORKLOADS.partitions),
    )
